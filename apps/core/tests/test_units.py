"""The dashboard's one formatting helper (apps/core/templatetags/units.py): sizes, rates, GPUs, ages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from apps.core.templatetags.units import format_age, format_bytes, format_gpus, format_rate

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "—"),
        (0, "0 B"),
        (67, "67 B"),  # regression: a 67-byte artifact was "0.0 GiB"
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (2**28, "256 MiB"),  # regression: 0.25 GiB was "0.2 GiB"
        (int(1.25 * 2**30), "1.25 GiB"),
        (int(110.5 * 2**30), "110.5 GiB"),
        (24 * 2**30, "24 GiB"),
        (3 * 2**40, "3 TiB"),
    ],
)
def test_a_size_is_shown_in_the_unit_that_reads_best(value, shown):
    assert format_bytes(value) == shown


def test_a_rate_uses_the_same_units_per_second():
    assert format_rate(67) == "67 B/s"  # regression: "(0 MiB/s)"
    assert format_rate(41.25 * 2**20) == "41.2 MiB/s"
    assert format_rate(None) == "—"


@pytest.mark.parametrize(("count", "shown"), [(0, "no GPU (CPU)"), (1, "1 GPU"), (4, "4 GPUs"), (None, "—")])
def test_a_gpu_count_is_said_in_words(count, shown):
    assert format_gpus(count) == shown  # regression: "no GPU(s)"


@pytest.mark.parametrize(
    ("ago", "shown"),
    [
        (timedelta(seconds=0), "just now"),  # regression: "0 minutes ago"
        (timedelta(seconds=-3), "just now"),
        (timedelta(seconds=12), "12 s ago"),
        (timedelta(minutes=3, seconds=20), "3 min ago"),
        (timedelta(hours=2, minutes=5), "2 h 5 min ago"),
        (timedelta(hours=14, minutes=5), "14 h ago"),
        (timedelta(days=3, hours=1), "3 d ago"),
    ],
)
def test_an_age_reads_like_a_person_would_say_it(ago, shown):
    assert format_age(NOW - ago, now=NOW) == shown


def test_never_is_said_for_no_moment():
    assert format_age(None) == "never"


def test_the_filters_are_loaded_by_name_in_templates():
    rendered = Template("{% load units %}{{ b|size }} {{ r|rate }} {{ g|gpus }}").render(
        Context({"b": 67, "r": 2**20, "g": 2})
    )
    assert rendered == "67 B 1 MiB/s 2 GPUs"
