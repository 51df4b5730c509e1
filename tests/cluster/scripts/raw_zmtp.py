"""A peer without the run's keys: a raw ZMTP 3.0 client (NULL mechanism, as a DEALER) that
connects to ADDRESS:PORT and streams one never-ending multipart message of 1 MiB frames, the
kind libzmq buffers, reconnecting when dropped: at most TOTAL bytes, CONNECTS connections and
SECONDS. Prints one JSON line: bytes sent, what the server sent back, connections made.

Usage: python raw_zmtp.py ADDRESS PORT TOTAL CONNECTS SECONDS"""

import json
import socket
import struct
import sys
import time

FRAME = 1 << 20


def greeting() -> bytes:
    # signature, version 3.0, mechanism NULL padded to 20 bytes, as-server 0, 31 bytes filler
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)


def ready() -> bytes:
    prop = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    body = b"\x05READY" + prop
    return b"\x04" + bytes([len(body)]) + body


def main() -> None:
    address, port = sys.argv[1], int(sys.argv[2])
    total, connects, seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    deadline = time.monotonic() + seconds
    frame = b"\x03" + struct.pack(">Q", FRAME) + bytes(FRAME)  # long frame, more to come
    sent, received, made = 0, b"", 0
    while sent < total and made < connects and time.monotonic() < deadline:
        try:
            peer = socket.create_connection((address, port), timeout=5)
        except OSError:
            time.sleep(0.2)
            continue
        made += 1
        peer.settimeout(2)
        try:
            peer.sendall(greeting() + ready())
            while sent < total and time.monotonic() < deadline:
                peer.sendall(frame)
                sent += len(frame)
        except OSError:
            pass  # dropped by the server: try again
        try:
            peer.setblocking(False)
            received += peer.recv(1 << 16)
        except OSError:
            pass
        peer.close()
    print(json.dumps({"sent": sent, "received": received.hex(), "connections": made}))


main()
