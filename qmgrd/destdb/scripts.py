"""The Lua scripts of the Redis destination state (:mod:`qmgrd.destdb.redisstate`).

Contract
--------
Each script is one atomic round trip on the keys of one destination (one hash tag, so one
Redis Cluster slot) and reads the time from the server (``TIME``): nodes' clocks never meet.
Their KEYS and ARGV are listed above each; the caller in ``redisstate`` passes them.
"""

from __future__ import annotations

__all__ = ["ADMIT", "ADOPT", "DEAD", "LIMIT", "RELEASE", "RENEW"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# The shared window (a hash: w window, s and f the feedback accumulators, t the server time
# of its last change), read with the node's initial window when it does not exist yet.
_WINDOW = """
local function window_of(key, init)
  local v = redis.call('HMGET', key, 'w', 's', 'f', 't')
  return tonumber(v[1] or init), tonumber(v[2] or '0'), tonumber(v[3] or '0'),
         tonumber(v[4] or '0')
end
local function window_set(key, w, s, f, t, ms)
  redis.call('HSET', key, 'w', w, 's', string.format('%.6f', s), 'f', string.format('%.6f', f),
             't', t)
  redis.call('PEXPIRE', key, ms)
end
"""

# KEYS: leases (zset), health (hash), rate TAT, learned limit, window (hash).
# ARGV: lease id, cap, ttl ms, rate interval ms (0 = none), node id, rate burst,
#       initial window (0 = no shared window).
# Returns {verdict, ms or probe flag, count, status, reason, cap in force, server time ms}.
ADMIT = _NOW + _WINDOW + """
local ttl = tonumber(ARGV[3])
local probe = 0
local h = redis.call('HMGET', KEYS[2], 'u', 'st', 'rs', 'p', 'pu')
if h[1] then
  local u = tonumber(h[1])
  if now < u then return {'dead', u - now, 0, h[2] or '', h[3] or '', 0, now} end
  if h[4] and h[4] ~= ARGV[5] and tonumber(h[5] or '0') > now then
    return {'wait', tonumber(h[5]) - now, 0, '', '', 0, now}
  end
  probe = 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
local cap = tonumber(ARGV[2])
local learned = tonumber(redis.call('GET', KEYS[4]) or '0')
if learned > 0 and (cap == 0 or learned < cap) then cap = learned end
local init = tonumber(ARGV[7])
if init > 0 then
  local w = window_of(KEYS[5], init)
  if cap == 0 or w < cap then cap = w end
end
if cap > 0 and count >= cap then return {'full', 0, count, '', '', cap, now} end
local interval = tonumber(ARGV[4])
if interval > 0 then
  local tat = tonumber(redis.call('GET', KEYS[3]) or '0')
  if tat < now then tat = now end
  local early = tat - (tonumber(ARGV[6]) - 1) * interval - now
  if early > 0 then return {'rate', math.ceil(early), count, '', '', cap, now} end
  redis.call('SET', KEYS[3], string.format('%.3f', tat + interval), 'PX',
             math.ceil(tat + interval - now) + 1000)
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
if probe == 1 then redis.call('HSET', KEYS[2], 'p', ARGV[5], 'pu', now + ttl) end
return {'ok', probe, count + 1, '', '', cap, now}
"""

# KEYS: leases, health, learned limit, window.
# ARGV: lease id, probe (0/1), ok (0/1), node id, dead ms, initial window (0 = no shared
#       window), cap, feedback ('p' positive, 'n' negative, '' none), its numerator, kind
#       (constant, concurrency, sqrt_concurrency) and denominator, window ttl ms, the lease's
#       grant time (server ms) and the sessions it was granted among (itself included).
# Postfix's feedback arithmetic (qmgrd.core.feedback.ConcurrencyWindow) on the shared window,
# with one more condition for growth: only a session granted at the current window, among
# as many sessions as the window, is evidence that the window works (a session granted
# before the last change, or below the window, says nothing about it).
RELEASE = _NOW + _WINDOW + """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' and redis.call('HGET', KEYS[2], 'p') == ARGV[4] then
  if ARGV[3] == '1' then
    redis.call('DEL', KEYS[2], KEYS[4])  -- revived for all, at the initial window
  else
    redis.call('HSET', KEYS[2], 'u', now + tonumber(ARGV[5]))
    redis.call('HDEL', KEYS[2], 'p', 'pu')
  end
  return 1
end
local init = tonumber(ARGV[6])
if init == 0 or ARGV[8] == '' then return 1 end
local w, s, f, t = window_of(KEYS[4], init)
local w0 = w
local num, kind, den = tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11])
local function step()
  if kind == 'constant' then return num / den end
  if kind == 'concurrency' then return num / w end
  return num / math.sqrt(w)
end
local function tolerance(g)
  if kind == 'sqrt_concurrency' then return 0 end
  return g / 2
end
if ARGV[8] == 'p' then
  local cap = tonumber(ARGV[7])
  local learned = tonumber(redis.call('GET', KEYS[3]) or '0')
  if learned > 0 and (cap == 0 or learned < cap) then cap = learned end
  local busy = redis.call('ZCARD', KEYS[1]) + 1
  local evidence = tonumber(ARGV[13]) > t and tonumber(ARGV[14]) >= w
  if evidence and (cap == 0 or w < cap) and w < busy + init then
    local g = step()
    s = s + g
    while s + tolerance(g) >= 1 do w = w + 1; s = s - 1; f = 0 end
    if cap > 0 and w > cap then w = cap end
  end
else
  local g = step()
  f = f - g
  while f - tolerance(g) < 0 do w = w - 1; s = 0; f = f + 1 end
  if w < 1 then w = 1 end
end
if w ~= w0 then t = now end
window_set(KEYS[4], w, s, f, t, tonumber(ARGV[12]))
return 1
"""

# KEYS: learned limit, window, leases. ARGV: limit, learned ttl ms, initial window, window
# ttl ms. The limit learned is the sessions still holding leases now, just after the refused
# one's release (each session the destination counted when it refused holds a lease; the
# refusal is a few ms old), else ARGV's (those running when the refused one was granted).
# While a learned limit holds, a new observation only lowers it. Returns the limit in force.
LIMIT = _NOW + _WINDOW + """
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local limit = redis.call('ZCARD', KEYS[3])
if limit < 1 then limit = tonumber(ARGV[1]) end
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if held > 0 and held < limit then limit = held end
redis.call('SET', KEYS[1], limit, 'PX', tonumber(ARGV[2]))
local init = tonumber(ARGV[3])
if init > 0 then
  local w = window_of(KEYS[2], init)
  if limit < w then w = limit end
  window_set(KEYS[2], w, 0, 0, now, tonumber(ARGV[4]))
end
return limit
"""

# KEYS: health. ARGV: dead ms, status, reason.
DEAD = _NOW + """
local ms = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 'u', now + ms, 'st', ARGV[2], 'rs', ARGV[3])
redis.call('HDEL', KEYS[1], 'p', 'pu')
redis.call('PEXPIRE', KEYS[1], ms + 3600000)
return 1
"""

# KEYS: leases. ARGV: ttl ms, lease ids... (added whether or not they are there)
ADOPT = _NOW + """
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + ttl, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return 1
"""

# KEYS: leases. ARGV: ttl ms, lease ids...
RENEW = _NOW + """
local ttl = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return 1
"""
