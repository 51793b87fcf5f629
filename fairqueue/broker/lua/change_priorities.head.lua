-- Change priorities, head piece: fairqueue's change script is this head + BullMQ's
-- own changePriority-7.lua + change_priorities.tail.lua, run once per pair.
-- KEYS[1..7]: changePriority's keys (wait, paused, meta, prioritized, active, pc,
-- marker).
-- ARGV[1]: job key prefix; then (job id, priority) pairs.
-- Returns BullMQ's code per job (0 ok, -1 missing).
-- Opens fqBullmqChange(), which BullMQ's script becomes the body of.
local fqPairs = {}
for i = 2, #ARGV, 2 do fqPairs[#fqPairs + 1] = {ARGV[i], ARGV[i + 1]} end
local fqPrefix = ARGV[1]
local function fqBullmqChange()
