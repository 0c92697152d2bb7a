"""Prometheus: ``UNICCL_METRICS_PORT=P`` serves each process's counters at
``http://<host>:<P + local rank>/metrics`` (one port per rank of a host), read from the
telemetry at scrape time, so a scrape costs the job nothing between scrapes.

Series (labels ``communicator``, ``rank``, ``op``, ``size`` — the message-size bucket, as its
upper bound — and, for links, ``peer``):
``uniccl_calls_total``, ``uniccl_bytes_total``, ``uniccl_call_seconds_total``,
``uniccl_call_latency_seconds`` (histogram, a bucket per power of two), ``uniccl_failed_calls_total``,
``uniccl_arrival_skew_seconds`` (histogram: how long the rank waited for the last to arrive, shared memory);
``uniccl_link_{sent,received}_bytes_total``, ``uniccl_link_{sent,received}_timed_bytes_total`` and
``uniccl_link_{send,receive}_seconds_total`` (bandwidth: timed bytes / seconds),
``uniccl_link_retransmits_total``, ``uniccl_link_checksum_failures_total``,
``uniccl_link_reconnects_total`` (TCP connections).
Needs ``prometheus-client`` (``pip install uniccl[metrics]``).
"""

from __future__ import annotations

import threading
import weakref

from .. import _env
from . import log as _log
from . import telemetry as _tel
from .log import logger

_comms: list = []
_server = None
_lock = threading.Lock()
# histogram bounds: 1 us .. ~137 s, a power of two apart, in nanoseconds
_BOUNDS_NS = [1 << k for k in range(10, 38)]


def port_for(local_rank: int) -> int | None:
    """UNICCL_METRICS_PORT + local rank (None: unset); InvalidArgument when it is not a port."""
    base = _env.port("UNICCL_METRICS_PORT")
    return None if base is None else base + local_rank


def serve(comm) -> int | None:
    """Serve this communicator's counters (with the process's others); the port, or None.
    Set but unservable (port taken, prometheus-client missing, telemetry off): a warning on
    stderr, once, when the first communicator is made."""
    global _server
    port = port_for(comm.local_rank)
    if port is None:
        return None
    if comm.telemetry is None:
        _log.warn("UNICCL_METRICS_PORT is set but UNICCL_TELEMETRY is off: no metrics served")
        return None
    if port > 65535:
        _log.warn(
            f"rank {comm.rank}: UNICCL_METRICS_PORT + local rank {comm.local_rank} = {port} is not a port: "
            "no metrics served"
        )
        return None
    with _lock:
        _comms.append(weakref.ref(comm))
        if _server is None:
            try:
                from prometheus_client import REGISTRY, start_http_server
            except ImportError:
                _log.warn(
                    "UNICCL_METRICS_PORT is set but prometheus-client is not installed "
                    "(pip install 'uniccl[metrics]'): no metrics served"
                )
                _server = False
                return None
            try:
                start_http_server(port)
            except OSError as exc:
                _log.warn(f"rank {comm.rank}: cannot serve metrics on port {port} (UNICCL_METRICS_PORT): {exc}")
                _server = False
                return None
            REGISTRY.register(_Collector())
            _server = port
            logger.info("rank %d: Prometheus metrics on port %d", comm.rank, port)
    return _server or None


def _histogram(hist):
    """Cumulative (le seconds, count) pairs of a telemetry histogram at power-of-two bounds."""
    out, total, i = [], 0, 0
    for bound in _BOUNDS_NS:
        while i < len(hist) and _tel.bucket_bounds(i)[1] <= bound:
            total += hist[i]
            i += 1
        out.append((str(bound / 1e9), total))
    total += sum(hist[i:])
    out.append(("+Inf", total))
    return out, total


class _Collector:
    def collect(self):
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        labels = ["communicator", "rank", "op", "size"]
        calls = CounterMetricFamily("uniccl_calls", "Calls completed", labels=labels)
        nbytes = CounterMetricFamily("uniccl_bytes", "Bytes of the calls' messages", labels=labels)
        seconds = CounterMetricFamily("uniccl_call_seconds", "Seconds in calls", labels=labels)
        latency = HistogramMetricFamily("uniccl_call_latency_seconds", "Call latency", labels=labels)
        failed = CounterMetricFamily("uniccl_failed_calls", "Calls that raised", labels=["communicator", "rank", "op"])
        skew = HistogramMetricFamily(
            "uniccl_arrival_skew_seconds",
            "How long this rank waited at each call's first rendezvous for the last rank (0: it was the last)",
            labels=["communicator", "rank"],
        )
        link_labels = ["rank", "peer"]
        link = {
            k: CounterMetricFamily(f"uniccl_link_{k}", h, labels=link_labels)
            for k, h in (
                ("sent_bytes", "Bytes sent to the peer"),
                ("sent_timed_bytes", "Bytes sent to the peer in messages of 32 KiB or more (timed)"),
                ("send_seconds", "Seconds spent sending messages of 32 KiB or more to the peer"),
                ("received_bytes", "Bytes received from the peer"),
                ("received_timed_bytes", "Bytes received from the peer in messages of 32 KiB or more (timed)"),
                ("receive_seconds", "Seconds spent receiving messages of 32 KiB or more from the peer"),
                ("retransmits", "Messages sent again to the peer"),
                ("checksum_failures", "Messages from the peer that failed their checksum"),
                ("reconnects", "Times the connection to the peer broke and was redialled"),
            )
        }
        meshes = set()
        for ref in list(_comms):
            comm = ref()
            if comm is None or comm.destroyed or comm.telemetry is None:
                continue
            t, name, rank = comm.telemetry, comm.name, str(comm.rank)
            for (op, k), st in list(t.ops.items()):
                lv = [name, rank, op, _tel.size_label(k)]
                calls.add_metric(lv, st.calls)
                nbytes.add_metric(lv, st.nbytes)
                seconds.add_metric(lv, st.ns / 1e9)
                buckets, _ = _histogram(st.histogram())
                latency.add_metric(lv, buckets, st.ns / 1e9)
            for op, n in list(t.failed.items()):
                failed.add_metric([name, rank, op], n)
            arrivals = comm.arrivals()
            if arrivals is not None and arrivals["calls"]:
                seen, buckets = 0, []
                for b, n in enumerate(arrivals["hist_log2_ns"]):  # bucket b: below 2**b ns (0: no wait)
                    seen += n
                    buckets.append((repr((1 << b) / 1e9 if b else 0.0), seen))
                buckets.append(("+Inf", seen))
                skew.add_metric([name, rank], buckets, arrivals["wait_ns"] / 1e9)
            mesh = comm.mesh
            if mesh is not None and mesh.links is not None and id(mesh) not in meshes:
                meshes.add(id(mesh))
                for peer, (tx_b, tx_ns, rx_b, rx_ns, resent, bad, tx_t, rx_t) in enumerate(mesh.links):
                    if peer == mesh.rank:
                        continue
                    lv = [str(mesh.rank), str(peer)]
                    for key, v in (
                        ("sent_bytes", tx_b),
                        ("sent_timed_bytes", tx_t),
                        ("send_seconds", tx_ns / 1e9),
                        ("received_bytes", rx_b),
                        ("received_timed_bytes", rx_t),
                        ("receive_seconds", rx_ns / 1e9),
                        ("retransmits", resent),
                        ("checksum_failures", bad),
                        ("reconnects", mesh.reconnects(peer)),
                    ):
                        link[key].add_metric(lv, v)
        yield from (calls, nbytes, seconds, latency, failed, skew, *link.values())
