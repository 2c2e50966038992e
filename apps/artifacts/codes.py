"""Codes of the artifacts domain, spelled as the source documents spell them."""

ARTIFACT_REHYDRATION_BLOCKED = "ARTIFACT_REHYDRATION_BLOCKED"
DEFERRED_EXTERNAL_VALIDATION = "DEFERRED_EXTERNAL_VALIDATION"
SOURCE_UNREACHABLE = "SOURCE_UNREACHABLE"
ARTIFACT_QUARANTINED = "ARTIFACT_QUARANTINED"
ARTIFACT_NOT_QUARANTINED = "ARTIFACT_NOT_QUARANTINED"
# A move an artifact's or replica's state does not allow, or one another process made first.
INVALID_ARTIFACT_STATE = "INVALID_ARTIFACT_STATE"
INVALID_REPLICA_STATE = "INVALID_REPLICA_STATE"
# Retry of an acquisition refused: only a failed one is acquired again (apps.artifacts.services).
ARTIFACT_NOT_FAILED = "ARTIFACT_NOT_FAILED"
# Rehydration refused: no recorded files to verify the upstream's bytes against (never acquired).
ARTIFACT_HAS_NO_FILES = "ARTIFACT_HAS_NO_FILES"
# A local path the control plane may not read (outside MODELFORGE_ARTIFACT_LOCAL_ROOTS, or its own data).
LOCAL_SOURCE_NOT_ALLOWED = "LOCAL_SOURCE_NOT_ALLOWED"

# Supply-chain rules (docs/security/MODEL_SUPPLY_CHAIN_POLICY.md): each failure names one.
RULE_ALLOWED_SOURCE = "ALLOWED_SOURCE"
RULE_DIGEST_MATCH = "DIGEST_MATCH"
RULE_FORMAT_ALLOWED = "FORMAT_ALLOWED"
RULE_SIZE_BOUNDS = "SIZE_BOUNDS"
RULE_LICENCE_REQUIRED = "LICENCE_REQUIRED"
RULE_REVISION_PINNED = "REVISION_PINNED"
