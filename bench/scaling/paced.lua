-- wrk script: heartbeats paced to a rate. Every connection waits BENCH_DELAY_MS between its response and its
-- next request (wrk 4 has no -R; that is wrk2), so the rate offered is about connections / (delay + latency):
-- run.py sizes the delay so the latency is a small part of it and prints the rate really sent.
-- BENCH_CREDENTIALS names a file with one credential per line (this instance's share of the fleet, each
-- sent once per cycle); BENCH_BODY a file with the JSON body.
local credentials = {}
local body = ""
local counter = 0
local pause = tonumber(os.getenv("BENCH_DELAY_MS"))

function init(args)
  for line in io.lines(os.getenv("BENCH_CREDENTIALS")) do
    credentials[#credentials + 1] = line
  end
  local f = assert(io.open(os.getenv("BENCH_BODY"), "r"))
  body = f:read("*a")
  f:close()
  counter = math.random(#credentials)
end

function delay()
  return pause
end

function request()
  counter = counter % #credentials + 1
  return wrk.format("POST", "/api/v1/agent/heartbeat", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. credentials[counter],
  }, body)
end

function done(summary, latency, requests)
  io.write(string.format("RESULT {\"requests\": %d, \"seconds\": %.3f, \"non_2xx\": %d, " ..
    "\"p50_ms\": %.2f, \"p99_ms\": %.2f, \"max_ms\": %.2f, \"errors\": %d}\n",
    summary.requests, summary.duration / 1e6, summary.errors.status,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
