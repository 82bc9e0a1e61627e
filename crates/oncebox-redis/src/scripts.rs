//! The key layout and the Lua scripts: every state change is one script, so Redis runs the
//! check and the write as one step and no other client can slip between them.
//!
//! A record is a hash under `{namespace}:k:{source}:{event_id}` with the fields
//!
//! | field   | meaning                                                              |
//! |---------|----------------------------------------------------------------------|
//! | `state` | `processing` (leased), `done` (kept for the retention), `uncertain` (no TTL) |
//! | `until` | `processing` only: the lease's end, ms on the Redis host's clock      |
//! | `ttl`   | `processing` only: `{length}:{until}`, the lease's length in ms and the `until` it was taken with, to re-anchor `until` after the clock stepped back |
//! | `fp`    | the payload fingerprint, 32 raw bytes                                |
//! | `token` | the fencing token of the holder that took or completed it (decimal)  |
//! | `attempt` | `processing` only: `{id}:{taken}:{token}`, the `begin` call that took the lease (a random id), whether it took it over, and the token it got, so that the call repeated after its reply was lost is answered with the same lease (and not with one an earlier build took over since, which leaves the field as it was) |
//! | `kind`  | `done` only: the response kind (`completed`, `rejected`, `stale`)    |
//! | `body`  | `done` only: the first response's body                               |
//!
//! and `{namespace}:fence` is the fencing counter. These names are stored in users' Redis: do
//! not change them (a rename makes every live lease and cached answer invisible).

use oncebox_core::Key;
use redis::Script;

/// Do not change: stored (see the module docs).
const RECORD_INFIX: &str = ":k:";
const FENCE_SUFFIX: &str = ":fence";

/// The record's Redis key. A source is a slug without `:`, so the first `:` after the infix
/// ends it and `(a, b:c)` and `(a:b, c)` can never share a key.
pub(crate) fn record_key(namespace: &str, key: &Key) -> Vec<u8> {
    let mut k = Vec::with_capacity(namespace.len() + 8 + 64 + key.event_id.as_str().len());
    k.extend_from_slice(namespace.as_bytes());
    k.extend_from_slice(RECORD_INFIX.as_bytes());
    k.extend_from_slice(key.source.as_str().as_bytes());
    k.push(b':');
    k.extend_from_slice(key.event_id.as_str().as_bytes());
    k
}

pub(crate) fn fence_key(namespace: &str) -> String {
    format!("{namespace}{FENCE_SUFFIX}")
}

/// KEYS: fence, record. ARGV: fingerprint, ttl in ms, the call's attempt id.
///
/// A call repeated with the attempt id of the one that took a live lease is that call again,
/// its reply lost on the way: answered with the same lease (token, and whether it took it
/// over), not as busy; the holder would otherwise wait out its own lease.
///
/// A lease lives until its `until` and its record as long again after it (the key's TTL), so a
/// `begin` in that time takes it over and says so (the third reply field): the earlier holder
/// may have made its call. A record without `until` (written by an earlier build, expiring with
/// its lease) is live while it exists.
///
/// A lease whose `until` lies further ahead than its own length (`ttl`) was dated by a clock
/// that has since stepped back: left so, it would hold the key for the length of the step (an
/// hour's step, an hour). The first contender re-anchors it to one length from now, and to
/// twice that for the record (Redis's own expiry is wall-clock time too): its holder keeps at
/// least the time it was promised, and the key is taken over one lease after the step was
/// seen, as on SQLite. The length is kept with the `until` it came with: a record without it,
/// or whose `until` an earlier build's `begin` has rewritten since (a rolling upgrade), is left
/// as it is, since the length could be another holder's.
///
/// The token is `INCR` of the fence counter, but never below the Redis server's clock in
/// microseconds: a Redis restarted empty forgets the counter, and without the floor it would
/// hand out 1, 2, 3… again — tokens a holder from before the restart may still carry. The
/// floor keeps tokens growing across restarts as long as the server's clock does not go back
/// (and fewer than a million tokens a second are taken, which one Redis cannot serve anyway):
/// a restart after the clock stepped back, or a failover to a replica whose clock lags, can
/// hand out tokens already handed out (the crate docs say what that costs).
/// Tokens stay below 2^53, so Lua's doubles hold them exactly; they travel as strings
/// (`GET`), because Lua's number-to-string conversion would round them.
const BEGIN: &str = r"
local rec = KEYS[2]
local found = redis.call('HMGET', rec, 'state', 'fp', 'kind', 'body', 'until', 'ttl', 'attempt',
  'token')
local state = found[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local taken = 0
if state then
  if found[2] ~= ARGV[1] then return {'conflict', found[2] or ''} end
  if state == 'done' then return {'done', found[3] or '', found[4] or ''} end
  if state == 'uncertain' then return {'uncertain'} end
  if not found[5] then return {'busy', redis.call('PTTL', rec)} end
  local ends = tonumber(found[5])
  local mine, was_taken, its = string.match(found[7] or '', '^(%x+):([01]):(%d+)$')
  local own = state == 'processing' and mine == ARGV[3] and its == found[8]
  if own and now < ends then
    return {'leased', found[8], tonumber(was_taken)}
  end
  if now < ends then
    local held, at = string.match(found[6] or '', '^(%d+):(%d+)$')
    held = tonumber(held)
    if held and tonumber(at) == ends and ends - now > held then
      ends = now + held
      redis.call('HSET', rec, 'until', string.format('%.0f', ends),
        'ttl', string.format('%.0f:%.0f', held, ends))
      redis.call('PEXPIRE', rec, string.format('%.0f', 2 * held))
    end
    return {'busy', ends - now}
  end
  -- This call's own lease, ended before its repeat came, was held by no one (its reply was
  -- lost): taken again, it is no takeover unless it was one itself. Told one, its caller
  -- parked the key uncertain though no effect had run.
  taken = own and tonumber(was_taken) or 1
end
local floor = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
if redis.call('INCR', KEYS[1]) < tonumber(floor) then
  redis.call('SET', KEYS[1], floor)
end
local token = redis.call('GET', KEYS[1])
local ttl = tonumber(ARGV[2])
redis.call('HSET', rec, 'state', 'processing', 'fp', ARGV[1], 'token', token,
  'until', string.format('%.0f', now + ttl), 'ttl', string.format('%.0f:%.0f', ttl, now + ttl),
  'attempt', ARGV[3] .. ':' .. taken .. ':' .. token)
redis.call('PEXPIRE', rec, string.format('%.0f', 2 * ttl))
return {'leased', token, taken}
";

/// KEYS: record. ARGV: token, kind, body, retention in ms.
///
/// A lease past its `until`, or a missing record (Redis forgot it), is fenced, even if nobody
/// took over yet, because someone may be about to. `done` under the same token is this holder's
/// own earlier completion whose reply was lost: answered `ok` again so a retry is safe.
///
/// The retention counts from the lease's start (`until` less the length `ttl` records), which
/// came before the inbox's own completion: counted from this call, the mark outlived the
/// inbox's record by up to a lease, and answered `done` for a key the inbox had purged. A
/// lease whose length is not known (an earlier build's) counts from now.
const COMPLETE: &str = r"
local found = redis.call('HMGET', KEYS[1], 'state', 'token', 'until', 'ttl')
if found[2] ~= ARGV[1] then return 'fenced' end
if found[1] == 'done' then return 'ok' end
if found[1] ~= 'processing' then return 'fenced' end
local keep = tonumber(ARGV[4])
if found[3] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ends = tonumber(found[3])
  if now >= ends then return 'fenced' end
  local held, at = string.match(found[4] or '', '^(%d+):(%d+)$')
  if held and tonumber(at) == ends then
    keep = math.max(1, keep - (now - (ends - tonumber(held))))
  end
end
redis.call('HSET', KEYS[1], 'state', 'done', 'kind', ARGV[2], 'body', ARGV[3])
redis.call('HDEL', KEYS[1], 'until', 'ttl', 'attempt')
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', keep))
return 'ok'
";

/// KEYS: record. ARGV: token. Frees the key while no one took it over from this holder (its
/// call failed: the key may be taken again at once).
const RELEASE: &str = r"
local found = redis.call('HMGET', KEYS[1], 'state', 'token')
if found[1] ~= 'processing' or found[2] ~= ARGV[1] then return 'fenced' end
redis.call('DEL', KEYS[1])
return 'ok'
";

/// KEYS: record. ARGV: token. Parks the key with no TTL: expiring it would let a redelivery
/// repeat an effect whose outcome nobody knows. A holder whose lease ended parks it too, while
/// no one took it over (as on the SQL stores). The token stays, so `uncertain` under the same
/// token is this holder's own earlier call whose reply was lost: `ok` again. `resolve` clears
/// or deletes it, so a repeat after the operator settled the key is refused.
const UNCERTAIN: &str = r"
local found = redis.call('HMGET', KEYS[1], 'state', 'token')
if found[2] ~= ARGV[1] then return 'fenced' end
if found[1] == 'uncertain' then return 'ok' end
if found[1] ~= 'processing' then return 'fenced' end
redis.call('HSET', KEYS[1], 'state', 'uncertain')
redis.call('HDEL', KEYS[1], 'until', 'ttl', 'attempt')
redis.call('PERSIST', KEYS[1])
return 'ok'
";

/// KEYS: record. ARGV: 'completed' or 'released', kind, body, retention in ms. 1 when the key
/// was uncertain and is now settled, 0 otherwise. The token is cleared: the operator settled
/// it, so the parked holder's later `complete` is refused, not taken for its own retry.
const RESOLVE: &str = r"
if redis.call('HGET', KEYS[1], 'state') ~= 'uncertain' then return 0 end
if ARGV[1] == 'released' then
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[1], 'state', 'done', 'kind', ARGV[2], 'body', ARGV[3], 'token', '')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 1
";

/// KEYS: record. ARGV: fingerprint, kind, body, ms left of the inbox record's retention.
/// Caches a committed answer only where Redis knows nothing of the key: a live lease or an
/// earlier answer is kept (the first response wins) with its expiry untouched, since pushing
/// it back could keep the answer past the inbox's record. 1 when stored.
const REMEMBER: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'fp', ARGV[1], 'kind', ARGV[2], 'body', ARGV[3],
  'token', '')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
";

/// The scripts, hashed once. `redis::Script` sends `EVALSHA` and loads the source on
/// `NOSCRIPT`, which is what a restarted Redis answers first.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub begin: Script,
    pub complete: Script,
    pub release: Script,
    pub uncertain: Script,
    pub resolve: Script,
    pub remember: Script,
}

impl Scripts {
    pub fn new() -> Scripts {
        Scripts {
            begin: Script::new(BEGIN),
            complete: Script::new(COMPLETE),
            release: Script::new(RELEASE),
            uncertain: Script::new(UNCERTAIN),
            resolve: Script::new(RESOLVE),
            remember: Script::new(REMEMBER),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_the_pair_apart() {
        let a = record_key("ns", &Key::parse("a", "b:c").unwrap());
        let b = record_key("ns", &Key::parse("a.b", "c").unwrap());
        assert_eq!(a, b"ns:k:a:b:c");
        assert_eq!(b, b"ns:k:a.b:c");
        assert_ne!(a, b);
        assert_eq!(fence_key("ns"), "ns:fence");
    }

    /// A connection to the Redis at `url`, and a fence and a record key of a namespace of
    /// their own.
    async fn connected(url: &str) -> (redis::aio::MultiplexedConnection, String, Vec<u8>) {
        let client = redis::Client::open(url).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        let ns = format!("oncebox-test-{}", uuid::Uuid::new_v4().simple());
        let rec = record_key(&ns, &Key::parse("s", "e").unwrap());
        (conn, fence_key(&ns), rec)
    }

    /// The begin script's call for a 60 s lease under `attempt`.
    fn begin_as<'a>(
        begin: &'a Script,
        fence: &str,
        rec: &[u8],
        attempt: &str,
    ) -> redis::ScriptInvocation<'a> {
        let mut c = begin.prepare_invoke();
        c.key(fence)
            .key(rec)
            .arg(&[7u8; 32][..])
            .arg(60_000)
            .arg(attempt);
        c
    }

    /// The begin script on the real Redis, called as a lost reply's repetition is: under the
    /// same attempt id it answers the lease it took; once another took the key over (here an
    /// earlier build's `begin`, which rewrites the token and leaves `attempt` as it was), it
    /// answers busy, never the other holder's token.
    #[test]
    fn a_repeated_begin_gets_its_own_lease_and_no_other() {
        let Some(url) = oncebox_testkit::service_url("ONCEBOX_REDIS_URL") else {
            return;
        };
        oncebox_testkit::run(async move {
            let (mut conn, fence, rec) = connected(&url).await;
            let begin = Script::new(BEGIN);
            let call = |attempt: &'static str| begin_as(&begin, &fence, &rec, attempt);
            let first: Vec<redis::Value> = call("aa01").invoke_async(&mut conn).await.unwrap();
            let again: Vec<redis::Value> = call("aa01").invoke_async(&mut conn).await.unwrap();
            assert_eq!(first, again, "the repetition gets the same lease");
            let other: Vec<redis::Value> = call("bb02").invoke_async(&mut conn).await.unwrap();
            assert_eq!(
                other.first(),
                Some(&redis::Value::BulkString(b"busy".to_vec()))
            );
            // An earlier build takes the key over: a new token, `attempt` left as it was.
            let () = redis::cmd("HSET")
                .arg(&rec)
                .arg("token")
                .arg("99")
                .query_async(&mut conn)
                .await
                .unwrap();
            let late: Vec<redis::Value> = call("aa01").invoke_async(&mut conn).await.unwrap();
            assert_eq!(
                late.first(),
                Some(&redis::Value::BulkString(b"busy".to_vec()))
            );
            let () = redis::cmd("DEL")
                .arg(&rec)
                .arg(&fence)
                .query_async(&mut conn)
                .await
                .unwrap();
        });
    }

    /// A repeat that comes after its own lease ended (the first try's reply was lost, and
    /// the lease was shorter than the repeat took) takes the key again as no takeover: no one
    /// held that lease. Told it was one, its caller parked the key uncertain for an operator
    /// though no effect had run. Another caller's lease ended is still a takeover.
    #[test]
    fn a_repeat_after_its_own_lease_ended_is_no_takeover() {
        let Some(url) = oncebox_testkit::service_url("ONCEBOX_REDIS_URL") else {
            return;
        };
        oncebox_testkit::run(async move {
            let (mut conn, fence, rec) = connected(&url).await;
            let begin = Script::new(BEGIN);
            let call = |attempt: &'static str| begin_as(&begin, &fence, &rec, attempt);
            // The lease ends (its record kept, as for as long again as the lease).
            let end = || {
                let mut c = redis::cmd("HSET");
                c.arg(&rec).arg("until").arg("1").arg("ttl").arg("60000:1");
                c
            };
            let taken = |v: &[redis::Value]| v.get(2).cloned();
            let first: Vec<redis::Value> = call("aa01").invoke_async(&mut conn).await.unwrap();
            let () = end().query_async(&mut conn).await.unwrap();
            let again: Vec<redis::Value> = call("aa01").invoke_async(&mut conn).await.unwrap();
            assert_eq!(again.first(), first.first(), "leased again");
            assert_ne!(again.get(1), first.get(1), "under a new token");
            assert_eq!(taken(&again), Some(redis::Value::Int(0)), "no takeover");
            let () = end().query_async(&mut conn).await.unwrap();
            let other: Vec<redis::Value> = call("bb02").invoke_async(&mut conn).await.unwrap();
            assert_eq!(
                taken(&other),
                Some(redis::Value::Int(1)),
                "another's: a takeover"
            );
            let () = redis::cmd("DEL")
                .arg(&rec)
                .arg(&fence)
                .query_async(&mut conn)
                .await
                .unwrap();
        });
    }
}
