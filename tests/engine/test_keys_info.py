"""Key layout, LockInfo parsing and argument checks (no Redis)."""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from django_redislock.engine import keys as keys_module
from django_redislock.engine.info import LockInfo
from django_redislock.engine.keys import KeySpace, LockKeys, glob_escape
from django_redislock.engine.slots import slot_tag
from django_redislock.engine.validate import (
    MAX_NAME_LENGTH,
    MAX_OWNER_LENGTH,
    json_dict,
    to_millis,
    validate_name,
    validate_owner,
    validate_seconds,
    validate_wait,
)

# -- Redis Cluster slots and Redis glob patterns, written from the specifications ---------------


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XModem), the checksum Redis Cluster hashes keys with."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def hash_tag(key: bytes) -> bytes | None:
    """The part of *key* Redis Cluster hashes when it has a non-empty ``{...}`` tag."""
    start = key.find(b"{")
    if start == -1:
        return None
    end = key.find(b"}", start + 1)
    if end == -1 or end == start + 1:
        return None
    return key[start + 1 : end]


def key_slot(key: bytes) -> int:
    tag = hash_tag(key)
    return crc16(key if tag is None else tag) % 16384


def test_crc16_matches_the_cluster_spec() -> None:
    assert crc16(b"123456789") == 0x31C3  # the check value in the Redis Cluster spec
    assert key_slot(b"{user1000}.following") == key_slot(b"{user1000}.followers")
    assert key_slot(b"foo{}{bar}") == crc16(b"foo{}{bar}") % 16384  # empty tag: whole key
    assert key_slot(b"foo{{bar}}zap") == crc16(b"{bar") % 16384


def test_crc16_agrees_with_redis_py() -> None:
    crc = pytest.importorskip("redis.crc")
    for key in (b"a", b"rl:{job}", b"foo{}{bar}", b"rl:{\\}x}", "é✓".encode()):
        assert key_slot(key) == crc.key_slot(key)


def redis_glob(pattern: str, text: str) -> bool:
    """Redis's MATCH for patterns of ``*``, ``?``, ``\\`` escapes and literals.

    An unescaped ``[`` fails the test: our patterns must never contain one.
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            raise AssertionError(f"unescaped '[' in {pattern!r}")
        else:
            out.append(re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), text, re.DOTALL) is not None


def unescaped_specials(pattern: str) -> list[tuple[int, str]]:
    found = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] in "*?[]":
            found.append((i, pattern[i]))
        i += 1
    return found


# -- KeySpace --------------------------------------------------------------------------------------

NAMES = [
    "job",
    "x",
    "}",
    "}x",
    "}}{{",
    "\\",
    "\\x",
    "\\\\",
    "\\}",
    "a}b",
    "a{b",
    "{x}",
    "{",
    "x:y:z",
    "*",
    "a?b[c]d\\e",
    "a|b",
    " ",
    "é✓ 名前",
    "x" * MAX_NAME_LENGTH,
]


def test_keys_layout() -> None:
    ks = KeySpace("rl")
    keys = ks.keys("job")
    slot = f"rl:slot:{{{slot_tag(key_slot(b'rl:{job}'))}}}"
    assert keys == LockKeys(
        "rl:{job}", slot, "rl:queue:{job}", "rl:waiters:{job}", "rl:holders:{job}"
    )
    assert keys.all == (b"rl:{job}", slot.encode(), b"rl:queue:{job}", b"rl:waiters:{job}")
    assert ks.keys("job") is keys  # cached


def test_every_slot_has_a_tag_that_hashes_to_it() -> None:
    # Checked against this module's own CRC16 (not the package's): all 16,384 slots.
    for slot in range(16384):
        tag = slot_tag(slot)
        assert re.fullmatch(r"[@A-O]{4}", tag), tag
        assert key_slot(b"x:{" + tag.encode() + b"}") == slot, slot
    with pytest.raises(ValueError, match="between 0 and 16383"):
        slot_tag(16384)


def test_names_in_one_slot_share_its_key_and_no_other() -> None:
    ks = KeySpace("rl")
    # "user1000" and "{user1000}x" are different names whose keys hash alike only by
    # chance; names of one slot are found by trying.
    by_slot: dict[str, list[str]] = {}
    for i in range(40000):
        by_slot.setdefault(ks.keys(f"n{i}").slot, []).append(f"n{i}")
    shared = next(names for names in by_slot.values() if len(names) > 1)
    a, b = (ks.keys(n) for n in shared[:2])
    assert a.slot == b.slot and a.lock != b.lock and a.queue != b.queue
    assert len(by_slot) <= 16384  # one key per slot, whatever the number of names


def test_keys_are_utf8_encoded() -> None:
    assert KeySpace("rl").keys("é").all[0] == "rl:{é}".encode()


@pytest.mark.parametrize("name", NAMES)
def test_name_key_name_round_trip(name: str) -> None:
    ks = KeySpace("rl")
    assert ks.name_from_key(ks.keys(name).lock) == name


def test_escaped_names() -> None:
    ks = KeySpace("rl")
    assert ks.keys("}x").lock == "rl:{\\}x}"
    assert ks.keys("\\x").lock == "rl:{\\\\x}"
    assert ks.keys("x\\").lock == "rl:{x\\}"  # only a leading escape character is doubled


def test_distinct_names_get_distinct_keys() -> None:
    ks = KeySpace("rl")
    for field in ("lock", "queue", "waiters"):
        keys = {getattr(ks.keys(name), field) for name in NAMES}
        assert len(keys) == len(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_key_of_a_lock_is_in_one_cluster_slot(name: str) -> None:
    all_keys = KeySpace("rl").keys(name).all
    # The lock's own keys share its tag; the slot's hash has a tag of its own, chosen
    # to hash to the same slot.
    tags = {hash_tag(key) for key in all_keys[:1] + all_keys[2:]}
    assert len(tags) == 1
    (tag,) = tags
    assert tag, "no usable hash tag: each key would hash as a whole, to different slots"
    assert len({key_slot(key) for key in all_keys}) == 1


@pytest.mark.parametrize(
    "key",
    [
        "rl:fence:{job}",
        "rl:slot:{job}",
        "rl:queue:{job}",
        "rl:waiters:{job}",
        "rl:wake:abc",
        "other:{job}",
        "rlx:{job}",
        "rl:{job",
        "rl:job}",
        "rl:{}",
        "rl:{\\}",
        "",
    ],
)
def test_name_from_key_rejects_other_keys(key: str) -> None:
    assert KeySpace("rl").name_from_key(key) is None


@pytest.mark.parametrize("prefix", ["", "a{b", "a}b", "a|b", None, b"rl"])
def test_bad_prefixes(prefix: Any) -> None:
    with pytest.raises(ValueError, match="REDISLOCK_KEY_PREFIX"):
        KeySpace(prefix)


def test_key_cache_starts_over_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys_module, "_KEY_CACHE_SIZE", 2)
    ks = KeySpace("rl")
    first = ks.keys("a")
    ks.keys("b")
    ks.keys("c")
    assert ks.keys("a") is not first  # forgotten, rebuilt
    assert ks.keys("a") == first
    assert len(ks._cache) <= 2


def test_wake_prefix() -> None:
    ks = KeySpace("app:locks")
    assert ks.wake_prefix == "app:locks:wake:"
    channel = ks.wake_prefix + "token"
    assert ks.name_from_key(channel) is None
    assert not redis_glob(ks.match_pattern(), channel)


def test_match_pattern_without_a_prefix_matches_lock_keys_only() -> None:
    ks = KeySpace("rl")
    pattern = ks.match_pattern()
    assert unescaped_specials(pattern) == [(len(pattern) - 1, "*")]
    for name in NAMES:
        keys = ks.keys(name)
        assert redis_glob(pattern, keys.lock), name
        for other in (keys.slot, keys.queue, keys.waiters):
            assert not redis_glob(pattern, other)


@pytest.mark.parametrize(
    ("name_prefix", "matching", "not_matching"),
    [
        ("a*", ["a*", "a*b"], ["a", "ab", "xa*"]),
        ("a?", ["a?", "a?x"], ["ab", "abx"]),
        ("a[bc]", ["a[bc]", "a[bc]d"], ["ab", "ac", "abd"]),
        ("a]", ["a]"], ["a"]),
        ("a\\", ["a\\", "a\\b"], ["a", "ab"]),
        ("}", ["}", "}x", "}}"], ["x}", "\\}x"]),
        ("\\", ["\\", "\\x", "\\\\"], ["x\\", "x"]),
        ("job:", ["job:", "job:1"], ["job", "jobs:1"]),
        ("[", ["[", "[x"], ["x"]),
        ("*?[]\\", ["*?[]\\x"], ["*?[]x", "ab[]\\"]),
    ],
)
def test_match_pattern_escapes_glob_characters(
    name_prefix: str, matching: list[str], not_matching: list[str]
) -> None:
    ks = KeySpace("rl")
    pattern = ks.match_pattern(name_prefix)
    assert unescaped_specials(pattern) == [(len(pattern) - 1, "*")], pattern
    for name in matching:
        assert redis_glob(pattern, ks.keys(name).lock), (pattern, name)
    for name in not_matching:
        assert not redis_glob(pattern, ks.keys(name).lock), (pattern, name)


def test_match_pattern_escapes_the_key_prefix() -> None:
    ks = KeySpace("r*l?[x]")
    pattern = ks.match_pattern("a")
    assert unescaped_specials(pattern) == [(len(pattern) - 1, "*")]
    assert redis_glob(pattern, ks.keys("ab").lock)
    assert not redis_glob(pattern, KeySpace("rZZlQx").keys("ab").lock)


def test_glob_escape() -> None:
    assert glob_escape("a*b?c[d]e\\f{g}") == "a\\*b\\?c\\[d\\]e\\\\f{g}"
    assert glob_escape("plain:text") == "plain:text"


# -- LockInfo.from_redis --------------------------------------------------------------------------

SINCE_MS = 1_700_000_000_000
META = (
    '{"host": "web-1", "pid": 4242, "thread": "MainThread", "purpose": "nightly",'
    ' "task_id": "t-1", "task_name": "app.tasks.sync", "kind": "semaphore",'
    ' "extra": {"tenant": 7}, "custom": [1, 2]}'
)
FIELDS_STR = {
    "owner": "proc:abc",
    "count": "2",
    "fence": "1700000000000123",
    "since": str(SINCE_MS),
    "ttl": "30000",
    "op": "proc.1",
    "meta": META,
}
FIELDS_BYTES = {k.encode(): v.encode() for k, v in FIELDS_STR.items()}
OBSERVED = datetime(2024, 1, 1, tzinfo=timezone.utc)


def info(fields: Any, pttl: int = 1500, name: str = "job") -> LockInfo:
    result = LockInfo.from_redis(name, f"rl:{{{name}}}", fields, pttl)
    assert result is not None
    return dataclasses.replace(result, observed_at=OBSERVED)


@pytest.mark.parametrize("fields", [FIELDS_STR, FIELDS_BYTES], ids=["str", "bytes"])
def test_lock_info_full(fields: Any) -> None:
    got = info(fields)
    assert got.name == "job" and got.key == "rl:{job}"
    assert got.owner == "proc:abc"
    assert got.hold_count == 2
    assert got.fencing_token == 1_700_000_000_000_123
    assert got.acquired_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert got.ttl == 1.5
    assert got.lease == 30.0
    assert (got.host, got.pid, got.thread) == ("web-1", 4242, "MainThread")
    assert (got.purpose, got.task_id, got.task_name) == ("nightly", "t-1", "app.tasks.sync")
    assert got.kind == "semaphore"
    assert got.extra == {"tenant": 7}
    assert got.meta == {"custom": [1, 2]}
    assert got.expires_at == OBSERVED + timedelta(seconds=1.5)
    assert got.age == OBSERVED - got.acquired_at


def test_lock_info_bytes_and_str_agree() -> None:
    assert info(FIELDS_BYTES) == info(FIELDS_STR)


@pytest.mark.parametrize(("pttl", "ttl"), [(-2, None), (-1, math.inf), (0, 0.0), (2500, 2.5)])
def test_lock_info_pttl(pttl: int, ttl: float | None) -> None:
    got = info(FIELDS_STR, pttl)
    assert got.ttl == ttl
    if ttl is None or math.isinf(ttl):
        assert got.expires_at is None
    else:
        assert got.expires_at == OBSERVED + timedelta(seconds=ttl)


def test_lock_info_of_a_foreign_key() -> None:
    got = info(None, -1)
    assert got.kind == "foreign"
    assert got.owner is None and got.hold_count is None and got.fencing_token is None
    assert got.acquired_at is None and got.age is None
    assert got.ttl == math.inf
    assert got.meta == {} and got.extra == {}


def test_lock_info_of_an_empty_hash() -> None:
    got = info({})
    assert got.kind == "lock"
    assert got.owner is None and got.lease is None and got.acquired_at is None


HOSTILE_FIELDS: list[dict[Any, Any]] = [
    {"meta": "not json"},
    {"meta": b"\xff\xfe{"},
    {"meta": "[1, 2]"},
    {"meta": "null"},
    {"meta": "NaN"},
    {"meta": "1" * 5000},  # an integer past Python's digit limit
    {"meta": '{"pid": "12", "host": 5, "extra": [1], "kind": 3, "thread": null}'},
    {"meta": ""},
    {"meta": 12},
    {"since": "9" * 30},
    {"since": "9" * 400},
    {"since": "9" * 5000},
    {"since": "-" + "9" * 30},
    {"since": "1e3"},
    {"since": b"\xff"},
    {"since": "0"},
    {"since": ""},
    {"count": "two"},
    {"count": b"\x00"},
    {"count": "1.5"},
    {"count": None},
    {"fence": "0x10"},
    {"ttl": "forever"},
    {"ttl": "0"},
    {"ttl": "-5"},
    {"owner": b"\xff\xfe"},
    {"owner": 12},
    {b"\xff": b"\xff", 3: 4, None: "x"},
]


@pytest.mark.parametrize("fields", HOSTILE_FIELDS, ids=[repr(f)[:40] for f in HOSTILE_FIELDS])
def test_lock_info_never_raises_on_hostile_fields(fields: dict[Any, Any]) -> None:
    got = info(fields, pttl=1000)
    assert got.kind in ("lock", "foreign")
    # What did not parse is unknown, never a wrong type.
    assert got.hold_count is None or type(got.hold_count) is int
    assert got.fencing_token is None or type(got.fencing_token) is int
    assert got.acquired_at is None or isinstance(got.acquired_at, datetime)
    assert got.lease is None or isinstance(got.lease, float)
    for text in (got.owner, got.host, got.thread, got.purpose, got.task_id, got.task_name):
        assert text is None or isinstance(text, str)
    assert isinstance(got.extra, dict) and isinstance(got.meta, dict)


def test_lock_info_hostile_values_are_unknown() -> None:
    got = info(
        {
            "meta": '{"pid": "12", "host": 5, "extra": [1], "kind": 3}',
            "since": "9" * 30,
            "count": "two",
            "owner": b"\xff",
        }
    )
    assert got.pid is None and got.host is None
    assert got.extra == {}
    assert got.kind == "lock"
    assert got.acquired_at is None
    assert got.hold_count is None
    assert got.owner == "\ufffd"
    assert info({"meta": "not json"}).meta == {}
    assert info({"since": "0"}).acquired_at is None
    assert info({"ttl": "0"}).lease is None


def test_lock_info_huge_lease_field() -> None:
    got = info({"ttl": "1" + "0" * 400})
    assert got.lease is None or math.isinf(got.lease)


def test_lock_info_deeply_nested_meta() -> None:
    got = info({"meta": "[" * 100_000})
    assert got.meta == {}


# -- validate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "x" * MAX_NAME_LENGTH, "é✓", "}", " "])
def test_validate_name_accepts(name: str) -> None:
    assert validate_name(name) is name


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("", ValueError),
        ("x" * (MAX_NAME_LENGTH + 1), ValueError),
        ("a\ud800b", ValueError),  # a lone surrogate cannot be encoded
        (b"job", TypeError),
        (None, TypeError),
        (5, TypeError),
    ],
)
def test_validate_name_rejects(name: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        validate_name(name)


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), (0.25, 0.25), (1e-9, 1e-9)])
def test_validate_seconds_accepts(value: Any, expected: float) -> None:
    result = validate_seconds(value, "ttl")
    assert result == expected and type(result) is float


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (-0.5, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
        ([1], TypeError),
    ],
)
def test_validate_seconds_rejects(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="ttl"):
        validate_seconds(value, "ttl")


def test_validate_seconds_huge_int() -> None:
    with pytest.raises((TypeError, ValueError)):
        validate_seconds(10**400, "ttl")


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), (0, 0.0), (0.0, 0.0), (-0.0, 0.0), (2, 2.0), (0.5, 0.5)]
)
def test_validate_wait(value: Any, expected: float | None) -> None:
    result = validate_wait(value, "timeout")
    assert result == expected
    if expected is not None:
        assert type(result) is float
        assert math.copysign(1.0, result) == 1.0  # -0.0 comes back as 0.0


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (math.inf, ValueError), (math.nan, ValueError), (False, TypeError),
     (True, TypeError), ("0", TypeError)],
)  # fmt: skip
def test_validate_wait_rejects(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="timeout"):
        validate_wait(value, "timeout")


@pytest.mark.parametrize("value", [-1, -0.5, math.inf, math.nan])
def test_a_wait_refused_says_what_is_accepted(value: Any) -> None:
    # Issue 41, defect 7: "must be a positive number" though 0 is a valid wait.
    with pytest.raises(ValueError) as raised:
        validate_wait(value, "timeout")
    assert str(raised.value) == (
        "timeout must be 0 (one attempt, no wait), a positive finite number of seconds, "
        f"or None (wait with no limit), got {value!r}"
    )
    with pytest.raises(TypeError) as typed:
        validate_wait(str(value), "timeout")
    assert str(typed.value) == (
        "timeout must be a number of seconds (0: one attempt) or None (no limit), not str"
    )


def test_seconds_that_may_be_none_say_so() -> None:
    with pytest.raises(ValueError) as raised:
        validate_seconds(0, "deadlock_timeout", "never look for a deadlock")
    assert str(raised.value) == (
        "deadlock_timeout must be a positive number of seconds "
        "or None (never look for a deadlock), got 0"
    )
    with pytest.raises(ValueError) as plain:
        validate_seconds(-1, "ttl")
    assert str(plain.value) == "ttl must be a positive number of seconds, got -1"


@pytest.mark.parametrize(
    ("seconds", "ms"), [(1.0, 1000), (0.001, 1), (0.0006, 1), (2.5, 2500), (86400, 86_400_000)]
)
def test_to_millis(seconds: float, ms: int) -> None:
    assert to_millis(seconds, "ttl") == ms


@pytest.mark.parametrize("seconds", [0.0004, 1e-9, 0.0])
def test_to_millis_below_one_ms(seconds: float) -> None:
    with pytest.raises(ValueError, match="ttl must be at least 1 ms"):
        to_millis(seconds, "ttl")


def test_to_millis_of_a_huge_valid_number() -> None:
    try:
        to_millis(validate_seconds(1e307, "ttl"), "ttl")
    except ValueError:
        pass  # refusing it as an invalid argument (in either function) would be fine


@pytest.mark.parametrize(
    ("owner", "expected"),
    [
        ("me", "me"),
        (b"me", "me"),
        ("é".encode(), "é"),
        ("x" * MAX_OWNER_LENGTH, "x" * MAX_OWNER_LENGTH),
        ("é" * MAX_OWNER_LENGTH, "é" * MAX_OWNER_LENGTH),  # counted in characters
    ],
)
def test_validate_owner_accepts(owner: Any, expected: str) -> None:
    result = validate_owner(owner)
    assert result == expected and type(result) is str


@pytest.mark.parametrize(
    ("owner", "error", "match"),
    [
        (b"\xff\xfe", ValueError, "UTF-8"),
        ("", ValueError, "characters"),
        (b"", ValueError, "characters"),
        ("x" * (MAX_OWNER_LENGTH + 1), ValueError, "characters"),
        (None, TypeError, "NoneType"),
        (5, TypeError, "int"),
        (bytearray(b"me"), TypeError, "bytearray"),
    ],
)
def test_validate_owner_rejects(owner: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        validate_owner(owner)


def test_json_dict() -> None:
    assert json_dict(None, "meta") is None
    value = {"a": [1, "x", None, {"b": 2.5}]}
    assert json_dict(value, "meta") is value
    assert json_dict({}, "meta") == {}


def _circular() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


@pytest.mark.parametrize(
    "value",
    [[], "x", 1, ("a", 1), {"a": object()}, {"a": {1, 2}}, {"a": b"bytes"}, _circular()],
    ids=["list", "str", "int", "tuple", "object", "set", "bytes", "circular"],
)
def test_json_dict_rejects(value: Any) -> None:
    with pytest.raises(TypeError, match="meta"):
        json_dict(value, "meta")


def test_lock_info_pid_true_is_not_a_pid() -> None:
    info = LockInfo.from_redis("n", "p:{n}", {b"owner": b"o", b"meta": b'{"pid": true}'}, 1000)
    assert info is not None
    assert info.pid is None


def test_a_mutex_handed_over_and_not_claimed_is_claiming_not_overdue() -> None:
    # Leased for the 2 s claim window, 0.3 s after the hand-off: not 28 s of missed renewals.
    handed = info({**FIELDS_STR, "hand": "2000"}, pttl=1700)
    assert handed.claiming and handed.claim_window == 2.0 and handed.lease == 30.0
    assert handed.renewed_ago == pytest.approx(0.3) and not handed.overdue
    assert handed.holders[0].claiming
    # Past the claim window's overdue mark (max(1, 2/3 + 1) s) it is overdue after all.
    assert info({**FIELDS_STR, "hand": "2000"}, pttl=200).overdue
    # Claimed ('hand' cleared, or '' in a reused hash): its own lease again.
    for claimed in ({**FIELDS_STR, "hand": ""}, FIELDS_STR):
        got = info(claimed, pttl=1700)
        assert not got.claiming and got.claim_window is None and got.overdue


def _shared_record(since: int, ttl: int, expiry: int) -> str:
    return f"1|{since * 1000}|{since}|{ttl}|op.1||{expiry}|{{}}"


@pytest.mark.parametrize(
    ("expiry_after", "ttl", "claiming"),
    [(2000, 30_000, True), (30_000, 30_000, False), (2000, 2000, False), (30_500, 30_000, False)],
    ids=["handed", "granted", "short-lease", "renewed"],
)
def test_a_semaphore_holder_handed_its_place_is_claiming(
    expiry_after: int, ttl: int, claiming: bool
) -> None:
    # A hand-off's lease ends exactly the claim window after its grant; Redis's "now"
    # is 'until' - PTTL (here 0.5 s after the grant).
    now = SINCE_MS + 500
    fields = {
        "type": "semaphore",
        "limit": "1",
        "until": str(now + 10_000),
        "s:p1": _shared_record(SINCE_MS, ttl, SINCE_MS + expiry_after),
    }
    got = info(fields, pttl=10_000)
    (holder,) = got.holders
    assert holder.claiming is claiming and got.claiming is claiming
    assert not holder.overdue
    if claiming:
        assert holder.renewed_ago == pytest.approx(0.5)
