"""The client's SCRAM login: one session per connection, carried on every call.

When a :class:`~logstore.client.security.ClientSecurity` says ``SASL_PLAINTEXT`` or
``SASL_SSL``, :class:`~logstore.client.routing.Connection` wraps its channel with a
:class:`SessionInterceptor` (``grpc.intercept_channel``). Then:

* the first call on the connection runs the SCRAM exchange (:class:`SessionLogin`,
  two ``SaslAuthenticate`` calls on the bare channel; :mod:`logstore.scram`) —
  lazily, once, under a lock, whatever the number of threads calling;
* every call carries the session token as metadata ``logstore-session``;
* a session is renewed before it runs out (at 90% of the lifetime the broker
  gave it), and when a call is refused because its session expired or is unknown
  (the broker restarted: sessions live in its memory), the interceptor logs in
  again once and sends the call again; a call made with ``.future()`` is sent
  again too, once, from a thread of its own (the login blocks). A client-streaming
  call is not (its requests are gone): its failure drops the session, so the next
  call logs in.

A login that fails ends the call that needed it with the error the broker gave
(``SASL_AUTHENTICATION_FAILED`` after the broker's fixed pause, or
``UNSUPPORTED_SASL_MECHANISM``, or an unreachable broker), mapped as any call's
error by :mod:`logstore.client.error_mapping`. The password is used to compute the
proof and is never sent; the broker's final message is checked, so a broker that
does not know the credential cannot pretend it does.

Thread-safety: :class:`SessionLogin` is shared by a connection's threads (one lock);
the interceptor keeps no state of its own.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import grpc

from logstore._proto import logstore_pb2 as pb
from logstore._proto import logstore_pb2_grpc as pb_grpc
from logstore.client.security import ClientSecurity
from logstore.errors import WIRE_CODE_KEY, LogstoreError, SaslAuthenticationError, error_for_code
from logstore.scram import ScramClient

__all__ = ["SESSION_METADATA_KEY", "SessionInterceptor", "SessionLogin"]

SESSION_METADATA_KEY = "logstore-session"  # as logstore.broker.security.principal names it
DEFAULT_LOGIN_TIMEOUT_S = 30.0
_RENEW_AT = 0.9  # of the session's lifetime


class SessionLogin:
    """The SCRAM session of one connection (see the module docstring)."""

    def __init__(self, address: str, security: ClientSecurity, channel: grpc.Channel) -> None:
        self.address = address
        self._security = security
        self._stub = pb_grpc.LogstoreStub(channel)  # the bare channel: no session on these calls
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0
        self.principal: str | None = None
        self.logins = 0  # how many exchanges succeeded (tests and debugging)

    def token(self, timeout_s: float | None) -> str:
        """A live session token, logging in first when there is none or it is due for renewal.
        Raises a failed call (:class:`grpc.RpcError`, also a :class:`grpc.Call`) when the login fails."""
        with self._lock:
            if self._token is None or time.monotonic() >= self._renew_at:
                self._login(timeout_s if timeout_s is not None else DEFAULT_LOGIN_TIMEOUT_S)
            assert self._token is not None
            return self._token

    def invalidate(self, token: str) -> None:
        """Forget ``token`` (the broker refused it); the next call logs in again."""
        with self._lock:
            if self._token == token:
                self._token = None

    def _login(self, timeout_s: float) -> None:
        sec = self._security
        assert sec.sasl_mechanism is not None and sec.sasl_plain_username is not None
        deadline = time.monotonic() + timeout_s
        scram = ScramClient(sec.sasl_mechanism, sec.sasl_plain_username, sec.sasl_plain_password or "")
        first = self._step(pb.SaslAuthenticateRequest(mechanism=scram.mechanism, auth_bytes=scram.first().encode()),
                           deadline)
        try:
            final = scram.final(first.auth_bytes.decode("utf-8", "replace"))
        except LogstoreError as e:
            raise LoginFailure(e) from None
        answer = self._step(pb.SaslAuthenticateRequest(mechanism=scram.mechanism, auth_bytes=final.encode(),
                                                       exchange_id=first.exchange_id), deadline)
        try:
            scram.verify(answer.auth_bytes.decode("utf-8", "replace"))
            if not answer.complete or not answer.session_token:
                raise SaslAuthenticationError("the broker ended the SCRAM exchange without a session")
        except LogstoreError as e:
            raise LoginFailure(e) from None
        lifetime_s = max(answer.session_lifetime_ms, 1) / 1000
        self._token = answer.session_token
        self._renew_at = time.monotonic() + lifetime_s * _RENEW_AT
        self.principal = answer.principal
        self.logins += 1

    def _step(self, request: pb.SaslAuthenticateRequest, deadline: float) -> pb.SaslAuthenticateResponse:
        response: pb.SaslAuthenticateResponse = self._stub.SaslAuthenticate(
            request, timeout=max(deadline - time.monotonic(), 0.001))  # a failure raises a grpc.RpcError
        if response.error.code:
            raise LoginFailure(error_for_code(response.error.code, response.error.message))
        return response


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _CallDetails(_Details, grpc.ClientCallDetails):
    pass


def _with_token(details: grpc.ClientCallDetails, token: str) -> grpc.ClientCallDetails:
    metadata = [(k, v) for k, v in (details.metadata or ()) if k != SESSION_METADATA_KEY]
    metadata.append((SESSION_METADATA_KEY, token))
    return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                        getattr(details, "wait_for_ready", None), getattr(details, "compression", None))


def _session_refused(outcome: Any) -> bool:
    """Whether a finished call was refused for its session (UNAUTHENTICATED + SASL code)."""
    try:
        if outcome.code() != grpc.StatusCode.UNAUTHENTICATED:
            return False
        return any(k == WIRE_CODE_KEY and v == SaslAuthenticationError.code for k, v in outcome.trailing_metadata() or ())
    except Exception:  # noqa: BLE001 - not a finished call: nothing to learn from it
        return False


class SessionInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.StreamUnaryClientInterceptor):
    """Adds the session to every call, logging in as needed (see the module docstring)."""

    def __init__(self, login: SessionLogin) -> None:
        self._login = login

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                              request: Any) -> Any:
        try:
            token = self._login.token(details.timeout)
        except grpc.RpcError as failed:
            return failed
        outcome = continuation(_with_token(details, token), request)
        if not outcome.done():  # a .future() call: sent again, once, if its session is refused
            return _ResentFuture(outcome, lambda: self._again(continuation, details, request, token))
        if not _session_refused(outcome):
            return outcome
        return self._again(continuation, details, request, token)

    def _again(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any,
               refused: str) -> Any:
        """Log in again (``refused`` is the token the broker refused) and send the call again."""
        self._login.invalidate(refused)
        try:
            token = self._login.token(details.timeout)
        except grpc.RpcError as failed:
            return failed
        return continuation(_with_token(details, token), request)

    def intercept_stream_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails,
                               request_iterator: Iterator[Any]) -> Any:
        try:
            token = self._login.token(details.timeout)
        except grpc.RpcError as failed:
            return failed
        outcome = continuation(_with_token(details, token), request_iterator)  # a stream is not replayed
        outcome.add_done_callback(lambda f: self._forget_if_refused(f, token))
        return outcome

    def _forget_if_refused(self, outcome: Any, token: str) -> None:
        if _session_refused(outcome):
            self._login.invalidate(token)


class _ResentFuture(grpc.Call, grpc.Future):
    """A ``.future()`` call that is sent again after a new login when the broker refuses its
    session: its outcome is the first call's, or the second's. The second is sent from a thread
    of its own (the login is two blocking calls; grpc's callback threads must not block)."""

    def __init__(self, first: Any, resend: Callable[[], Any]) -> None:
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._call = first
        self._callbacks: list[Callable[[Any], None]] | None = []
        self._cancelled = False
        self._resend = resend
        first.add_done_callback(self._on_first)

    def _on_first(self, first: Any) -> None:
        if self._cancelled or not _session_refused(first):
            self._finish(first)
        else:
            threading.Thread(target=self._send_again, name="logstore-relogin", daemon=True).start()

    def _send_again(self) -> None:
        try:
            second = self._resend()
        except Exception as e:  # noqa: BLE001 - the future must complete whatever happens
            second = LoginFailure(SaslAuthenticationError(f"logging in again failed: {e}"))
        with self._lock:
            self._call = second
        second.add_done_callback(self._finish)

    def _finish(self, call: Any) -> None:
        with self._lock:
            self._call = call
            callbacks, self._callbacks = self._callbacks or [], None
            self._finished.set()
        for fn in callbacks:
            fn(self)

    def _wait(self, timeout: float | None) -> Any:
        if not self._finished.wait(timeout):
            raise grpc.FutureTimeoutError()
        return self._call

    # grpc.Future
    def cancel(self) -> bool:
        self._cancelled = True
        return bool(self._call.cancel())

    def cancelled(self) -> bool:
        return self._finished.is_set() and bool(self._call.cancelled())

    def running(self) -> bool:
        return not self._finished.is_set()

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> Any:
        return self._wait(timeout).result()

    def exception(self, timeout: float | None = None) -> Any:
        return self._wait(timeout).exception()

    def traceback(self, timeout: float | None = None) -> Any:
        return self._wait(timeout).traceback()

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(fn)
                return
        fn(self)

    # grpc.Call (asked once the call is over, as the client does)
    def initial_metadata(self) -> Any:
        return self._wait(None).initial_metadata()

    def trailing_metadata(self) -> Any:
        return self._wait(None).trailing_metadata()

    def code(self) -> Any:
        return self._wait(None).code()

    def details(self) -> Any:
        return self._wait(None).details()

    def is_active(self) -> bool:
        return not self._finished.is_set()

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return bool(self._call.add_callback(callback))


class LoginFailure(grpc.RpcError, grpc.Call, grpc.Future):
    """A failed login as a finished, failed call: the error mapping of the client turns it
    into ``error`` again (its code travels as the ``logstore-error-code`` metadata)."""

    def __init__(self, error: LogstoreError) -> None:
        super().__init__(error.message)
        self.error = error

    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ((WIRE_CODE_KEY, self.error.code),)

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return self.error.message

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def traceback(self, timeout: float | None = None) -> types.TracebackType | None:
        return None

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)
