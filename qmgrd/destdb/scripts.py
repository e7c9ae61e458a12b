"""The Lua scripts of the Redis destination state (:mod:`qmgrd.destdb.redisstate`).

Contract
--------
Each script is one atomic round trip on the keys of one destination (one hash tag, so one
Redis Cluster slot) and reads the time from the server (``TIME``): nodes' clocks never meet.
Their KEYS and ARGV are listed above each; the caller in ``redisstate`` passes them.
"""

from __future__ import annotations

__all__ = ["ADMIT", "ADOPT", "DEAD", "RELEASE", "RENEW"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: leases (zset), health (hash), rate TAT, learned limit.
# ARGV: lease id, cap, ttl ms, rate interval ms (0 = none), node id.
ADMIT = _NOW + """
local ttl = tonumber(ARGV[3])
local probe = 0
local h = redis.call('HMGET', KEYS[2], 'u', 'st', 'rs', 'p', 'pu')
if h[1] then
  local u = tonumber(h[1])
  if now < u then return {'dead', u - now, 0, h[2] or '', h[3] or ''} end
  if h[4] and h[4] ~= ARGV[5] and tonumber(h[5] or '0') > now then
    return {'wait', tonumber(h[5]) - now, 0, '', ''}
  end
  probe = 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
local cap = tonumber(ARGV[2])
local learned = tonumber(redis.call('GET', KEYS[4]) or '0')
if learned > 0 and (cap == 0 or learned < cap) then cap = learned end
if cap > 0 and count >= cap then return {'full', 0, count, '', ''} end
local interval = tonumber(ARGV[4])
if interval > 0 then
  local tat = tonumber(redis.call('GET', KEYS[3]) or '0')
  if tat > now then return {'rate', math.ceil(tat - now), count, '', ''} end
  redis.call('SET', KEYS[3], string.format('%.3f', now + interval), 'PX',
             math.ceil(interval) + 1000)
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
if probe == 1 then redis.call('HSET', KEYS[2], 'p', ARGV[5], 'pu', now + ttl) end
return {'ok', probe, count + 1, '', ''}
"""

# KEYS: leases, health. ARGV: lease id, probe (0/1), ok (0/1), node id, dead ms.
RELEASE = _NOW + """
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] == '1' and redis.call('HGET', KEYS[2], 'p') == ARGV[4] then
  if ARGV[3] == '1' then
    redis.call('DEL', KEYS[2])
  else
    redis.call('HSET', KEYS[2], 'u', now + tonumber(ARGV[5]))
    redis.call('HDEL', KEYS[2], 'p', 'pu')
  end
end
return 1
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
