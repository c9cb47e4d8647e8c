"""The gateway's access log never shows query strings (where a careless client puts keys)."""

import logging

from inhouse.gateway.serve import DropQueryStrings


def test_query_string_is_dropped_from_uvicorn_access_records() -> None:
    args = ("127.0.0.1:5000", "GET", "/v1/models?api_key=ih-secret", "1.1", 200)
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', args, None
    )
    assert DropQueryStrings().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "GET /v1/models HTTP/1.1" 200'
