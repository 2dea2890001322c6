"""Credentials in URIs are removed from every text daskcfa shows (daskcfa/errors.py)."""

import pytest

from daskcfa.errors import FragmentReadError, redact, uri_secrets

SIGNED = {
    # S3 query-string authentication, signature version 2 (still issued by older tools and mirrors)
    "s3 v2": "https://bucket.s3.amazonaws.com/a.nc?AWSAccessKeyId=AKIAEXAMPLEKEYID1234&Expires=1893456000"
             "&Signature=c2lnbmF0dXJlX3ZhbHVl",
    # Google Cloud Storage V2 signed URL
    "gcs v2": "https://storage.googleapis.com/b/a.nc?GoogleAccessId=reader%40project.iam.gserviceaccount.com"
              "&Expires=1893456000&Signature=Z2NzX3NpZ25hdHVyZQ",
    "s3 v4": "https://bucket.s3.amazonaws.com/a.nc?X-Amz-Credential=AKIAEXAMPLEKEYID1234%2F20261128%2Fus-east-1"
             "&X-Amz-Signature=abcdef0123456789",
}


@pytest.mark.parametrize("form", SIGNED)
def test_signed_urls_lose_their_key_ids_and_signatures(form):
    url = SIGNED[form]
    secrets = {part.split("=", 1)[1] for part in url.split("?", 1)[1].split("&") if not part.startswith("Expires")}
    shown = redact(url)
    assert not any(secret in shown for secret in secrets), shown
    assert secrets <= uri_secrets(url)
    message = str(FragmentReadError("cannot read", file=url, variable="tas", fragment=(0,)))
    assert not any(secret in message for secret in secrets), message


@pytest.mark.parametrize("url, secret", [
    ("https://h/a.nc?auth=c2VjcmV0X2F1dGg", "c2VjcmV0X2F1dGg"),
    ("https://h/a.nc?x=1&Authorization=Bearer%20abcdef123456", "Bearer%20abcdef123456"),
    ("https://h/cb?code=4%2F0AbCdEfGh&state=x", "4%2F0AbCdEfGh"),
    ("https://h/a.nc?session=S3SSIONID0123", "S3SSIONID0123"),
    ("https://h/a.nc?X%2DAmz%2DSignature=abcdef0123456789", "abcdef0123456789"),
    ("https://h/a.nc;token=tok0123456789", "tok0123456789"),
    ("https://h/a.nc#access_token=frag0123456789&type=bearer", "frag0123456789"),
    ("https://h/a.nc?a=1;sig=semi0123456789", "semi0123456789"),
])
def test_secret_parameters_in_other_spellings_and_places_are_redacted(url, secret):
    """Found by attack14: ``auth``/``code``/``session`` parameters, percent-encoded names, and
    parameters after ``;`` or in the fragment kept their values."""
    assert secret not in redact(url), redact(url)
    assert secret in uri_secrets(url)
    message = str(FragmentReadError("cannot read", file=url, variable="tas", fragment=(0,)))
    assert secret not in message, message


@pytest.mark.parametrize("url", ["http:/reader:pw0123456789@host/a.nc", "https:///reader:pw0123456789@host/a.nc",
                                 "http://reader:12/pw0123456789@host/a.nc", "https://r:4/pw0123456789/x@@h:1/a.nc"])
def test_a_login_after_a_scheme_typed_without_two_slashes_is_redacted(url):
    """Found by attack15: a URL typed with one slash is taken as a local path, and the "not found"
    error named it, password and all. Also (session 16, failing on bfd4ce5) a password of digits, then
    a ``/`` not percent-encoded: URL parsers take ``reader:12`` for host and port, the rest for the path."""
    assert "pw0123456789" not in redact(url), redact(url)
    assert any("pw0123456789" in found for found in uri_secrets(url))
    message = str(FragmentReadError("cannot read", file=url, variable="tas", fragment=(0,)))
    assert "pw0123456789" not in message, message


def test_characters_a_terminal_acts_on_are_escaped_in_every_error():
    """A name from a hostile file quoted in an error's reason (an escape sequence clearing the screen,
    a bell, a right-to-left override): a traceback printed it raw to the terminal (session 16: only
    the command line's own output was escaped). Now shown as Python escapes; line breaks kept."""
    reason = "no variable named 'tas\x1b[2J\x07\u202egnp.exe'\nsecond line"
    error = FragmentReadError(reason, file="/data/a\x1b[31m.nc", variable="v\u202e", fragment=(0,))
    text = str(error)
    assert not any(c in text for c in "\x1b\x07\u202e"), text
    assert "\\x1b[2J\\x07\\u202egnp.exe" in text and "\nsecond line" in text
    assert error.reason.startswith("no variable named 'tas\\x1b")
