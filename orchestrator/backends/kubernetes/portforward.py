"""A local TCP port relayed to a pod's port through the API server (``kubectl port-forward``).

Used when the controller runs outside the cluster and cannot reach Service addresses. Each
accepted local connection opens its own port-forward stream (the official client's websocket
``portforward``, v4.channel.k8s.io) and two threads copy bytes both ways.

Each stream is opened on an ApiClient of its own (a copy of the backend's configuration),
closed when the stream ends, never on the backend's shared one: the client's ``portforward``
swaps ``call_api`` on the ApiClient it is given while the stream opens, so concurrent streams
on a shared client left it swapped, and the backend's ordinary calls (the scrape, teardown)
then went to the websocket transport and failed (``Missing required parameter `ports```).

The emulated cluster (orchestrator/kcluster) serves this websocket protocol, so the tests run
this path as a workstation does (tests/integration/test_kcluster.py).
"""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
from collections.abc import Callable

from kubernetes import client
from kubernetes.stream import portforward


def stream_client(shared: client.ApiClient) -> client.ApiClient:
    """A new ApiClient for one stream: a copy of ``shared``'s configuration (host, TLS, the
    current credentials and their refresh hook) and default headers, sharing no state with it."""
    own = client.ApiClient(copy.deepcopy(shared.configuration), cookie=shared.cookie)
    own.default_headers.update(shared.default_headers)
    return own


class PortForward:
    """``http://127.0.0.1:<local_port>`` relayed to ``pod:port`` in ``namespace``; close() stops
    it, and the connections it relays."""

    def __init__(self, api_client: client.ApiClient, namespace: str, pod: str, port: int,
                 log: Callable[[str], None] | None = None):
        self._shared = api_client  # its configuration is copied per stream; never used for a stream
        self.namespace, self.pod, self.port = namespace, pod, port
        self.log = log or (lambda line: None)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.local_port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        threading.Thread(target=self._accept, name=f"pf-{pod}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._relay, args=(conn,), name=f"pf-{self.pod}-conn", daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        api = stream_client(self._shared)
        pf = None
        try:
            core = client.CoreV1Api(api)
            pf = portforward(core.connect_get_namespaced_pod_portforward, self.pod, self.namespace,
                             ports=str(self.port))
            remote = pf.socket(self.port)
            remote.setblocking(True)
            back = threading.Thread(target=_pump, args=(remote, conn), name=f"pf-{self.pod}-back", daemon=True)
            back.start()
            _pump(conn, remote)
            back.join(timeout=5)
        except Exception as e:  # noqa: BLE001 - a stream that cannot open fails its connection only
            self.log(f"port-forward to {self.namespace}/{self.pod}:{self.port} failed: {type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._conns.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()
            if pf is not None:
                with contextlib.suppress(Exception):
                    pf.close()
            with contextlib.suppress(Exception):
                api.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in its thread
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # their relays then close their streams and clients
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either end closes; then shut both down."""
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
