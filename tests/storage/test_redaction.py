"""Credentials held by daskcfa are blanked in every log record of the process."""

from __future__ import annotations

import base64
import logging
import secrets

from daskcfa.storage import redaction


def test_credential_values_reach_nested_options_and_authorization_headers():
    password = "pw-" + secrets.token_hex(6)
    login = base64.b64encode(f"reader:{password}".encode()).decode()
    options = {"s3": {"key": "AKIDEXAMPLE1", "secret": "s" * 30, "use_listings_cache": False,
                      "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "aws_session_token": "tok-123456"},
                      "config_kwargs": {"read_timeout": 61.5}},
               "https://host/": {"headers": {"Authorization": f"Basic {login}"}}}
    found = redaction.credential_values(options)
    assert {"AKIDEXAMPLE1", "s" * 30, "tok-123456", f"Basic {login}", login, password} <= found
    assert not found & {"reader", "http://127.0.0.1:9000", "61.5"}  # a user name or endpoint is no secret


def test_records_of_child_loggers_and_later_handlers_are_redacted():
    """A filter on ``botocore`` would miss ``botocore.auth`` and handlers added later; the record factory does not."""
    token = "session-token-" + secrets.token_urlsafe(16)
    redaction.remember({"s3": {"token": token}})
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    logger = logging.getLogger("botocore.endpoint.test-redaction")
    handler = Capture(logging.DEBUG)
    saved = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        logger.debug("headers={'X-Amz-Security-Token': %r}", token.encode())
        logger.debug(f"canonical request with {token} inline")
        logger.debug("nothing secret: %d", 42)
        try:
            raise PermissionError(f"refused token {token}")
        except PermissionError:
            logger.exception("request failed")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
    assert len(lines) == 4 and not any(token in line for line in lines)
    assert "PermissionError: refused token ***" in lines[3]
    assert lines[0].count("***") == 1 and lines[2] == "nothing secret: 42"
