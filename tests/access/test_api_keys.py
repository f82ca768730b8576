"""API keys as an operator writes them (a ``name=key`` file) and as a face checks them:
the principal is the name, a bad file is refused with the line, and no key ever shows."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pyrula_stream import ConfigurationError
from pyrula_stream.access.api_keys import (
    SESSION_MAX_AGE_S,
    APIKeyAuth,
    load_api_keys,
    parse_api_keys,
)

KEY_A = "a-0123456789abcdef0123456789abcdef"
KEY_B = "b-fedcba9876543210fedcba9876543210"


def test_a_key_file_names_principals_and_the_name_is_who_calls(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# the web front end\nweb = {KEY_A}\n\n  # ops\nops={KEY_B}  \n")
    auth = load_api_keys(path)
    assert auth.names == ("ops", "web")
    assert (auth.principal(KEY_A), auth.principal(KEY_B)) == ("web", "ops")
    assert auth.principal(KEY_A.encode()) == "web"
    for wrong in ("", KEY_A[:-1], KEY_A + "x", "web", "ключ"):
        assert auth.principal(wrong) is None
    assert APIKeyAuth(KEY_A).principal(KEY_A) == "api-key"  # the seeds' single-key form
    # A key may hold '=': only the first one separates the name.
    assert parse_api_keys(f"ci={KEY_A}==\n").principal(f"{KEY_A}==") == "ci"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no keys"),
        ("# only comments\n\n", "holds no keys"),
        (f"web={KEY_A}\nweb={KEY_B}\n", "line 2: the name 'web' is given twice"),
        (f"web={KEY_A}\nops {KEY_B}\n", "line 2: expected name=key"),
        (f"={KEY_A}\n", "line 1: expected name=key"),
        ("web=\n", "line 1: expected name=key"),
        (f"web={KEY_A}\nops={KEY_A}\n", "'web' and 'ops' are the same key"),
    ],
)
def test_a_bad_key_file_is_refused_with_its_line_and_never_its_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=message) as refused:
        load_api_keys(path)
    assert KEY_A not in str(refused.value) and KEY_B not in str(refused.value)
    assert str(path) in str(refused.value)


def test_a_missing_key_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the API key file"):
        load_api_keys(tmp_path / "nope")


def test_keys_stay_out_of_repr_str_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    auth = APIKeyAuth({"web": KEY_A, "ops": KEY_B})
    caplog.set_level(logging.DEBUG)
    logging.getLogger("test").info("auth is %s / %r", auth, auth)
    shown = repr(auth) + str(auth) + caplog.text
    assert "web" in shown and KEY_A not in shown and KEY_B not in shown


def test_a_browser_session_token_is_derived_from_the_key_and_dies_with_it() -> None:
    auth = APIKeyAuth({"web": KEY_A, "ops": KEY_B})
    token = auth.session_token("web")
    assert KEY_A not in token and token != auth.session_token("ops")
    assert auth.session_principal(token) == "web"
    assert auth.session_principal(KEY_A) is None  # the key itself is not a session
    rotated = APIKeyAuth({"web": KEY_B + "new", "ops": KEY_B})
    assert rotated.session_principal(token) is None


@pytest.mark.parametrize("name", ["alice:ops", "a b", "x/y", "é", "-web", "web\n"])
def test_a_principal_name_outside_the_safe_alphabet_is_refused(name: str) -> None:
    """A principal is part of thread and idempotency keys, whose separator is ``:``:
    ``alice`` + thread ``ops:t`` must never be ``alice:ops`` + thread ``t``."""
    with pytest.raises(ConfigurationError, match="letters, digits") as refused:
        APIKeyAuth({name: KEY_A})
    assert KEY_A not in str(refused.value)


def test_a_principal_name_in_the_safe_alphabet_is_taken() -> None:
    auth = APIKeyAuth({"alice.ops@example-1_2": KEY_A})
    assert auth.principal(KEY_A) == "alice.ops@example-1_2"


def test_a_key_under_32_characters_is_refused_unless_allowed(tmp_path: Path) -> None:
    short = "k" * 31
    with pytest.raises(ConfigurationError, match="32 characters") as refused:
        APIKeyAuth({"web": short})
    assert short not in str(refused.value)
    path = tmp_path / "keys"
    path.write_text(f"web={short}\n")
    with pytest.raises(ConfigurationError, match=r"line 1.*32 characters"):
        load_api_keys(path)
    assert APIKeyAuth({"web": short}, allow_short_keys=True).principal(short) == "web"
    assert load_api_keys(path, allow_short_keys=True).principal(short) == "web"
    assert APIKeyAuth({"web": "k" * 32}).principal("k" * 32) == "web"


def test_a_browser_session_carries_its_issue_time_and_ends_after_its_max_age() -> None:
    auth = APIKeyAuth({"web": KEY_A})
    token = auth.session_token("web", issued_s=1_000_000)
    assert token.startswith("1000000.")
    assert auth.session_principal(token, now_s=1_000_000) == "web"
    assert auth.session_principal(token, now_s=1_000_000 + SESSION_MAX_AGE_S - 1) == "web"
    assert auth.session_principal(token, now_s=1_000_000 + SESSION_MAX_AGE_S + 1) is None
    forged = "2000000." + token.partition(".")[2]  # a later issue time on the same MAC
    assert auth.session_principal(forged, now_s=2_000_000) is None
    assert auth.session_principal(token, now_s=900_000) is None  # issued in the future
    for junk in ("", ".", "x.y", "1000000", "-5.abc", "1e9." + token.partition(".")[2]):
        assert auth.session_principal(junk, now_s=1_000_000) is None
