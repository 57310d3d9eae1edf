"""zvfs.fs.push's message, whatever buffer holds the bytes. That the kernel takes it (its
layout is linux/fuse.h's) is tested through real mounts in test_mount_raw.py: a message
it refused would push nothing, and those tests count the opens pushed."""

from __future__ import annotations

import os

import pytest

from zvfs.fs.push import PagePush


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "writable view", "read-only view", "empty"])
def test_a_push_writes_one_message_ending_in_exactly_the_bytes(kind: str) -> None:
    payload = bytes(range(256)) * 3
    data = {
        "bytes": payload,
        "bytearray": bytearray(payload),
        "writable view": memoryview(bytearray(b"##" + payload + b"##"))[2:-2],
        "read-only view": memoryview(b"##" + payload + b"##")[2:-2],
        "empty": b"",
    }[kind]
    want = bytes(data)
    r, w = os.pipe()
    try:
        assert PagePush(w).push(12345, data)
        message = os.read(r, 1 << 16)
    finally:
        os.close(r)
        os.close(w)
    assert int.from_bytes(message[:4], "little") == len(message)  # one whole message
    assert message.endswith(want)
    assert int.from_bytes(message[-len(want) - 8:-len(want) - 4], "little") == len(want)  # size
    assert 12345 in (int.from_bytes(message[i:i + 8], "little") for i in range(0, len(message) - 7, 4))
