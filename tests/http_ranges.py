"""The part of the tests' local HTTP servers that answers a GET or HEAD of a
file with a single byte range (fsspec's HTTP file system reads in ranged
blocks): the status line and headers, shared so each server keeps only what
it does differently (stalls, cuts, refusals)."""
import re


def send_range_headers(handler, data):
    """Send 200 (whole file) or 206 (the `bytes=a-b` range asked for) with the
    headers fsspec needs; return the (start, end) byte offsets, end inclusive."""
    start, end, status = 0, len(data) - 1, 200
    m = re.match(r"bytes=(\d+)-(\d*)$", handler.headers.get("Range", ""))
    if m:
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        status = 206
    handler.send_response(status)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Accept-Ranges", "bytes")
    handler.send_header("Content-Length", str(end - start + 1))
    if status == 206:
        handler.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
    handler.end_headers()
    return start, end
