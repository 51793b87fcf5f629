--[[
  The hashes of the jobs a history page saw start (``fairqueue.broker.history_page``):
  one call instead of a command per job, so the loop spends little on each. Read only.
  Stops after the job whose data brings the total over the page's byte budget.

  KEYS    the started jobs' hash keys, in stream order
  ARGV    the byte budget of job data
  Returns per job, flat: timestamp, delay, ats, opts, data, fqPaid, fqCost (false where
  absent).
]]
--- @argv budget
local out, budget, bytes = {}, tonumber(ARGV.budget), 0
for i = 1, #KEYS do
  if bytes > budget then break end
  local row = redis.call('HMGET', KEYS[i], 'timestamp', 'delay', 'ats', 'opts', 'data', 'fqPaid',
    'fqCost')
  for j = 1, 7 do out[#out + 1] = row[j] end
  if row[5] then bytes = bytes + #row[5] end
end
return out
