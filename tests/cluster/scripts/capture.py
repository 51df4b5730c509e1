"""Capture the frames crossing the switch: an AF_PACKET socket on every port of the namespace
it runs in (`ip netns exec ember-sw`), each frame once (as it enters the bridge, not again as
it leaves). Writes each frame as a 4-byte big-endian length and the bytes, until SIGTERM or
SIGINT, SECONDS, or MAX_BYTES of frames. Prints "capturing" once the socket is bound.

Usage: python capture.py OUT SECONDS MAX_BYTES"""

import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
stop = False


def finish(number: int, frame: object) -> None:
    global stop
    stop = True


def main() -> None:
    out, seconds, max_bytes = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.settimeout(0.2)  # so a stop signal or the deadline is seen within 0.2 s
    deadline = time.monotonic() + seconds
    written = 0
    print("capturing", flush=True)
    with open(out, "wb") as sink:
        while not stop and time.monotonic() < deadline and written < max_bytes:
            try:
                frame, where = sock.recvfrom(1 << 16)
            except TimeoutError:
                continue
            if where[2] == PACKET_OUTGOING:
                continue
            sink.write(struct.pack(">I", len(frame)) + frame)
            written += len(frame)
    print(f"captured {written} bytes", flush=True)


main()
