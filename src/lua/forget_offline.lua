-- Forget what an offline user left behind once its last seen is past the
-- retention: the last-seen field and the status text. (`seq`, which also
-- dates the last activity, stays: the transitions' order needs it.)
-- The chosen status and the privacy settings stay: forgetting them would
-- show an invisible or hidden user online when it comes back.
--
-- KEYS[1] presence-status:{<user>}     status hash
-- KEYS[2] presence-count:{<user>}      live device counter
--
-- Returns the number of fields removed; 0 when the user is online again
-- (then nothing is forgotten).
if redis.call('EXISTS', KEYS[2]) == 0 then
  return redis.call('HDEL', KEYS[1], 'last_seen', 'text')
end
return 0
