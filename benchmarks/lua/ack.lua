-- wrk script: every request is a different subtask's ack (one per subtask and checkpoint, so each is recorded,
-- never a duplicate). Arguments after `--`: job id, checkpoint ids (comma-separated), vertices, parallelism.
local threads = {}

function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

function init(args)
  job = args[1]
  cps = {}
  for id in string.gmatch(args[2], "[^,]+") do table.insert(cps, id) end
  vertices = tonumber(args[3])
  parallelism = tonumber(args[4])
  nthreads = tonumber(args[5])
  per_cp = vertices * parallelism
  counter = 0
  tid = tonumber(tid)
  headers = {["Content-Type"] = "application/json"}
end

function request()
  local k = counter * nthreads + tid
  counter = counter + 1
  local cp = cps[math.floor(k / per_cp) % #cps + 1]
  local i = k % per_cp
  local vertex = math.floor(i / parallelism)
  local index = i % parallelism
  local body = string.format(
    '{"attempt":1,"vertex":"v%d","subtask_index":%d,"metrics":{"sync_duration":1,"async_duration":3,' ..
    '"alignment_duration":0,"processed_data":4096,"persisted_data":1024,"unaligned":true},' ..
    '"source_offsets":{"split-%d":12345}}', vertex, index, i)
  return wrk.format("POST", "/api/v1/jobs/" .. job .. "/checkpoints/" .. cp .. "/acks", headers, body)
end
