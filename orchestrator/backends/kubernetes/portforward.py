"""A local TCP port relayed to a pod's port through the API server (``kubectl port-forward``).

Used when the controller runs outside the cluster and cannot reach Service addresses. Each
accepted local connection opens its own port-forward stream (the official client's websocket
``portforward``) and two threads copy bytes both ways. kmock speaks no websocket, so this part
is exercised on real clusters only; the tests reach the router through ``endpoint_url``.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from kubernetes import client
from kubernetes.stream import portforward


class PortForward:
    """``http://127.0.0.1:<local_port>`` relayed to ``pod:port`` in ``namespace``; close() stops it."""

    def __init__(self, api_client: client.ApiClient, namespace: str, pod: str, port: int):
        self._core = client.CoreV1Api(api_client)
        self.namespace, self.pod, self.port = namespace, pod, port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.local_port = self._listener.getsockname()[1]
        self._closed = threading.Event()
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
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        pf = portforward(
            self._core.connect_get_namespaced_pod_portforward, self.pod, self.namespace,
            ports=str(self.port),
        )
        remote = pf.socket(self.port)
        remote.setblocking(True)

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while chunk := src.recv(65536):
                    dst.sendall(chunk)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pump, args=(remote, conn), daemon=True)
        back.start()
        pump(conn, remote)
        back.join(timeout=5)
        conn.close()
        pf.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
