-- Add jobs, head piece: fairqueue's add script is this head + BullMQ's own
-- addPrioritizedJob-9.lua + add_jobs.tail.lua, run once per job of a batch.
-- Before each run it sets the job's priority option to the level's next virtual
-- finish tag (fqTag); a job id that already exists is left to BullMQ.
-- KEYS[1..9]: addPrioritizedJob's keys; KEYS[10]: fairqueue's per-level tag hash.
-- ARGV[1]: number of jobs n; then per job BullMQ's four arguments (packed args,
-- JSON data, packed opts, timestamp) and the level name.
-- Returns, per job, the job id and the priority given (0: the id existed).
-- This file is a Python %%-template (scripts.add_script_source fills the tag steps,
-- floor and back; a doubled percent sign stands for one): Lua once filled.
-- Opens fqBullmqAdd(), which BullMQ's script becomes the body of.
local fqCall = redis.call
local fqStep = {critical = %(critical)d, high = %(high)d, normal = %(normal)d, low = %(low)d}
local fqOffset = {critical = 0, high = 1, normal = 2, low = 3}
local fqStepByOffset = {[0] = %(critical)d, [1] = %(high)d, [2] = %(normal)d, [3] = %(low)d}
local fqFloor = %(floor)d
local fqBack = %(back)d
local function fqTag(level)
  local head = fqCall('ZRANGEBYSCORE', KEYS[4], fqFloor * 4294967296,
    fqBack * 4294967296 - 1, 'WITHSCORES', 'LIMIT', 0, 1)
  local base = fqFloor
  if #head > 0 then
    local headPrio = math.floor(tonumber(head[2]) / 4294967296)
    local offset = headPrio %% 4
    base = headPrio - offset - fqStepByOffset[offset]
    if base < fqFloor then base = fqFloor end
  else
    fqCall('DEL', KEYS[10])
  end
  base = base - base %% 4
  local last = tonumber(fqCall('HGET', KEYS[10], level) or '0')
  if last < base then last = base end
  local tag = last + fqStep[level]
  local priority = tag + fqOffset[level]
  if priority >= fqBack then return fqBack end
  fqCall('HSET', KEYS[10], level, tag)
  return priority
end
local function fqBullmqAdd()
