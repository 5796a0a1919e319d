"""Admission: the requests one server process holds in flight, against its budgets (count, body bytes, pixels).

Admission (``Admission``): each process admits requests while what the requests in it (being read,
checked, waiting for a serving thread, worked on) cost fits its budgets: their count
(``TPUSTREAM_SERVING_THREADS`` + ``TPUSTREAM_SERVING_QUEUE``: a flood of tiny requests cannot queue without
end), their body bytes (charged from ``Content-Length`` before the body is read, the body cap when the body
is chunked, then its real size: the memory waiting requests hold) and their images' pixels (charged from the
image headers on an intake thread, before the request waits for a serving thread: the decoding work ahead of
a new request, which bounds its wait). A request that does not fit is a 503 with ``Retry-After``, before
its body is read when the bytes do not fit (a client sending ``Expect: 100-continue``, as curl does for large
bodies, does not even send it). A request within the per-request limits always fits an otherwise empty
server. Small requests cost next to nothing: 8 clients of 8 small images each are all answered.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Admission", "Ticket"]


@dataclass
class Ticket:
    """What one admitted request holds of the in-flight budgets, until it is answered or refused."""

    body_bytes: int
    pixels: int = 0
    released: bool = False


class Admission:
    """The requests of one server process in flight (their bodies being read, checked, waiting for a
    serving thread or worked on) against three budgets: their count, their body bytes (the memory they
    hold while they wait: body, parsed JSON, image bytes) and their images' pixels from the headers (the
    decoding work queued ahead of a new request, which bounds its wait). A request is admitted when it fits,
    or when nothing else holds that budget (so a request within the per-request limits is always served
    alone); otherwise it is refused with a 503. Thread-safe: the event loop admits, worker threads release."""

    def __init__(self, *, requests: int, body_bytes: int, pixels: int) -> None:
        self.max_requests, self.max_body_bytes, self.max_pixels = requests, body_bytes, pixels
        self.requests = self.body_bytes = self.pixels = 0
        self._lock = threading.Lock()

    def admit(self, body_bytes: int) -> Ticket | str:
        """A ticket holding ``body_bytes`` (the declared body, or the body cap when none is declared), or
        why not: the message of the 503."""
        with self._lock:
            if self.requests >= self.max_requests:
                return (
                    f"busy: {self.requests} requests already in, the most this server process takes "
                    "(TPUSTREAM_SERVING_THREADS + TPUSTREAM_SERVING_QUEUE): retry shortly"
                )
            if self.body_bytes and self.body_bytes + body_bytes > self.max_body_bytes:
                return (
                    f"busy: request bodies of {self.body_bytes} bytes already in, and this one's {body_bytes} "
                    f"would exceed the in-flight budget of {self.max_body_bytes} (TPUSTREAM_INFLIGHT_BYTES): "
                    "retry shortly"
                )
            self.requests += 1
            self.body_bytes += body_bytes
            return Ticket(body_bytes=body_bytes)

    def resize(self, ticket: Ticket, body_bytes: int) -> None:
        """The body has arrived: hold its real size instead (at most what was declared; more when the request's
        images were read from Cloud Storage, which it then holds as well)."""
        with self._lock:
            if not ticket.released:
                self.body_bytes += body_bytes - ticket.body_bytes
                ticket.body_bytes = body_bytes

    def add_pixels(self, ticket: Ticket, pixels: int) -> str | None:
        """Charge the request's pixels, read from its image headers; None, or why not (the 503's message)."""
        with self._lock:
            if self.pixels and self.pixels + pixels > self.max_pixels:
                return (
                    f"busy: images of {_pixel_count(self.pixels)} already in, and this request's "
                    f"{_pixel_count(pixels)} would exceed the in-flight budget of {_pixel_count(self.max_pixels)} "
                    "(TPUSTREAM_INFLIGHT_PIXELS): retry shortly"
                )
            self.pixels += pixels
            ticket.pixels = pixels
            return None

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            self.requests -= 1
            self.body_bytes -= ticket.body_bytes
            self.pixels -= ticket.pixels


def _pixel_count(pixels: int) -> str:
    return f"{pixels / 1e6:.1f} MP" if pixels >= 100_000 else f"{pixels} px"
