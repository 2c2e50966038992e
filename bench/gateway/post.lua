-- POST BENCH_BODY with an optional BENCH_AUTH bearer; prints one RESULT line (latencies in microseconds).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY") or "{}"
wrk.headers["Content-Type"] = "application/json"
local auth = os.getenv("BENCH_AUTH") or ""
if auth ~= "" then wrk.headers["Authorization"] = "Bearer " .. auth end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%d,"seconds":%.3f,"p50_us":%d,"p99_us":%d,"errors":%d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
