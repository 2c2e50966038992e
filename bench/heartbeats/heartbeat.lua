-- wrk script: every request is one node's heartbeat, cycling through the enrolled credentials.
-- BENCH_CREDENTIALS names a file with one credential per line; BENCH_BODY a file with the JSON body.
local credentials = {}
local body = ""
local counter = 0

local function read_file(path)
  local f = assert(io.open(path, "r"))
  local content = f:read("*a")
  f:close()
  return content
end

function init(args)
  for line in io.lines(os.getenv("BENCH_CREDENTIALS")) do
    credentials[#credentials + 1] = line
  end
  body = read_file(os.getenv("BENCH_BODY"))
  counter = math.random(#credentials)
end

function request()
  counter = counter % #credentials + 1
  return wrk.format("POST", "/api/v1/agent/heartbeat", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer " .. credentials[counter],
  }, body)
end

local failures = 0
function response(status, headers, body)
  if status ~= 200 then failures = failures + 1 end
end

function done(summary, latency, requests)
  io.write(string.format("RESULT {\"requests\": %d, \"seconds\": %.3f, \"non_2xx\": %d, " ..
    "\"p50_ms\": %.2f, \"p99_ms\": %.2f, \"max_ms\": %.2f, \"errors\": %d}\n",
    summary.requests, summary.duration / 1e6, summary.errors.status,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency.max / 1000,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
