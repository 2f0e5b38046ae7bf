"""Sending a webhook delivery: signed by the Standard Webhooks specification, to an address
checked and pinned so that no tenant's URL reaches inside the network.

**Signing.** `webhook-id` (the delivery's id, the same on every try), `webhook-timestamp`
(the try's Unix seconds) and `webhook-signature`: `v1,` and the base64 HMAC-SHA256 of
`id.timestamp.body` under the endpoint's secret (the base64 after `whsec_`); while a rotation
overlaps, a second `v1,` signature by the previous secret, space-separated, as the
specification allows. OpenAI's SDK (`client.webhooks.unwrap`) and the `standardwebhooks`
package verify it as it is.

**Where it may go.** The URL's host is resolved, and every address it resolves to must be
public: not loopback, private, link-local (the cloud metadata address 169.254.169.254 among
them), multicast, reserved or unspecified, unless the operator allows the host or a range
(`PROMPTJOBS_WEBHOOK_ALLOW_HOSTS`, `PROMPTJOBS_WEBHOOK_ALLOW_RANGES`). The connection then
goes to the address checked, not to a second lookup (the URL's host stays in `Host` and in
TLS's server name), so a DNS answer that changes between the check and the connection cannot
reach inside. Redirects are not followed; connect and read time out; a response body is read
only up to what is kept for the deliveries view.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from projections import metrics
from projections.store import JobStore
from projections.webhooks import DELIVERED, FAILED, PENDING, ToSend

# What is kept of a receiver's answer for the deliveries view.
KEPT_BODY_BYTES = 1024
USER_AGENT = "promptjobs-webhooks/1"
# How long a URL's host may take to resolve (at registration, at a submission, at a try).
RESOLVE_TIMEOUT_S = 5.0
# The type of the failure that makes Temporal try a delivery again (by the workflow's policy).
UNDELIVERED = "WebhookUndelivered"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,` signature of the message under `secret` (`whsec_…`)."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(
    secrets: Iterable[str], message_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, message_id, timestamp, body) for s in secrets),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }


class AddressRefused(ValueError):
    """A webhook URL this service will not send to; the message says why."""


@dataclass(frozen=True)
class Allowed:
    """What the operator allows besides public addresses (development, tests)."""

    hosts: frozenset[str] = frozenset()
    ranges: tuple[Network, ...] = ()

    @classmethod
    def of(cls, hosts: Iterable[str], ranges: Iterable[str]) -> Allowed:
        return cls(
            frozenset(h.lower() for h in hosts),
            tuple(ipaddress.ip_network(r, strict=False) for r in ranges),
        )

    def address(self, address: Address) -> bool:
        return any(address in network for network in self.ranges)


def _inside(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


@dataclass(frozen=True)
class Target:
    """Where a URL's request goes: the address checked, and the URL's own host."""

    url: httpx.URL
    address: str

    def pinned(self) -> tuple[httpx.URL, dict[str, str], dict[str, object]]:
        """The URL to connect to (the address), its Host header, and TLS's server name."""
        host = self.url.host
        default = {"http": 80, "https": 443}[self.url.scheme]
        port = self.url.port or default
        shown = host if port == default else f"{host}:{port}"
        extensions: dict[str, object] = {}
        if self.url.scheme == "https":
            extensions["sni_hostname"] = host
        return self.url.copy_with(host=self.address), {"host": shown}, extensions


def check_url(url: str) -> httpx.URL:
    """The URL's shape: http(s), a host, no credentials. Raises AddressRefused."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as err:
        raise AddressRefused(f"not a URL: {err}") from err
    if parsed.scheme not in ("http", "https"):
        raise AddressRefused("a webhook URL is http:// or https://")
    if not parsed.host:
        raise AddressRefused("a webhook URL names a host")
    if parsed.userinfo:
        raise AddressRefused("a webhook URL carries no user name or password")
    if len(url) > 2000:
        raise AddressRefused("a webhook URL is at most 2000 characters")
    return parsed


async def resolve(url: str, allowed: Allowed) -> Target:
    """Where a request to `url` may go, or AddressRefused: each address its host resolves
    to must be public, or allowed by the operator. Nothing is sent."""
    parsed = check_url(url)
    host = parsed.host
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if host.lower() in allowed.hosts:
        return Target(parsed, host)
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses: list[Address] = [literal]
    else:
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                found = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
        except TimeoutError:
            raise AddressRefused(f"{host} did not resolve within {RESOLVE_TIMEOUT_S:g} s") from None
        except OSError as err:
            raise AddressRefused(f"{host} does not resolve: {err}") from err
        addresses = [ipaddress.ip_address(info[4][0]) for info in found]
    if not addresses:
        raise AddressRefused(f"{host} does not resolve")
    for address in addresses:
        if _inside(address) and not allowed.address(address):
            raise AddressRefused(
                f"{host} resolves to {address}, an address inside a network (loopback, "
                "private, link-local or reserved): webhooks go only to public addresses"
            )
    return Target(parsed, str(addresses[0]))


@dataclass
class WebhookActivities:
    store: JobStore
    allowed: Allowed = field(default_factory=Allowed)
    timeout_s: float = 10.0
    # Tries in flight at once per endpoint in this worker: one tenant's slow endpoint holds
    # at most this many slots; past it a try is put off (a retry a moment later).
    per_endpoint: int = 8
    # Each endpoint's turns: at most `per_endpoint` tries in flight at once here.
    _turns: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    _client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=min(5.0, self.timeout_s)),
                follow_redirects=False,
                limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
            )
        return self._client

    @activity.defn(name="deliver_webhook")
    async def deliver_webhook(self, delivery_id: str) -> str:
        """One try of the delivery: its state after (`delivered`, `failed`), or a retryable
        failure that Temporal tries again by the workflow's schedule. With the endpoint's
        tries in flight here at their most, it is put off at once (a retry a moment later),
        holding no worker slot."""
        return await self.deliver(delivery_id, wait_s=0.0)

    async def deliver(self, delivery_id: str, *, wait_s: float) -> str:
        """One try; with the endpoint's tries in flight at their most, wait up to `wait_s`
        for a turn (a first try made outside any worker slot), else put it off."""
        to_send = await self.store.webhooks.to_send(delivery_id)
        if to_send is None or to_send.delivery.state != PENDING:
            return "gone" if to_send is None else to_send.delivery.state
        endpoint, url = to_send.endpoint, to_send.url
        if url is None:
            await self.store.webhooks.gave_up(delivery_id, "its endpoint was deleted")
            return FAILED
        if endpoint is not None and endpoint.disabled_at is not None:
            why = f"its endpoint is disabled: {endpoint.disabled_reason}"
            await self.store.webhooks.gave_up(delivery_id, why)
            return FAILED
        # A job's own webhooks take turns by their org and host, as an endpoint's do.
        place = endpoint.endpoint_id if endpoint else f"{to_send.delivery.org} {_host(url)}"
        turns = self._turns.setdefault(place, asyncio.Semaphore(self.per_endpoint))
        try:
            if turns.locked() and wait_s <= 0:
                raise TimeoutError
            await asyncio.wait_for(turns.acquire(), wait_s or None)
        except TimeoutError:
            raise ApplicationError(
                "this endpoint has its tries in flight already", type=UNDELIVERED
            ) from None
        try:
            return await self._try(to_send)
        finally:
            turns.release()

    async def _try(self, to_send: ToSend) -> str:
        delivery, endpoint, url = to_send.delivery, to_send.endpoint, to_send.url
        assert url is not None
        webhooks = self.store.webhooks
        try:
            target = await resolve(url, self.allowed)
        except AddressRefused as err:
            await webhooks.tried(delivery.delivery_id, status=None, error=str(err), state=FAILED)
            metrics.WEBHOOKS.labels(outcome="refused").inc()
            return FAILED
        body = delivery.payload.encode()
        now = datetime.now(UTC)
        headers = signed_headers(to_send.secrets(now), delivery.delivery_id, int(time.time()), body)
        pinned, host, extensions = target.pinned()
        try:
            async with self._http().stream(
                "POST", pinned, content=body, headers={**headers, **host}, extensions=extensions
            ) as answer:
                kept = await _head_of(answer)
                status = answer.status_code
        except httpx.HTTPError as err:
            error = f"{type(err).__name__}: {err}"[:500]
            await webhooks.tried(delivery.delivery_id, status=None, error=error)
            metrics.WEBHOOKS.labels(outcome="retried").inc()
            raise ApplicationError(f"not delivered: {error}", type=UNDELIVERED) from err
        if 200 <= status < 300:
            await webhooks.tried(delivery.delivery_id, status=status, error=None, state=DELIVERED)
            metrics.WEBHOOKS.labels(outcome="delivered").inc()
            metrics.WEBHOOK_LATENCY.observe(
                (datetime.now(UTC) - delivery.created_at).total_seconds()
            )
            return DELIVERED
        error = f"HTTP {status}: {kept}" if kept else f"HTTP {status}"
        if status == 410:
            await webhooks.tried(delivery.delivery_id, status=status, error=error, state=FAILED)
            if endpoint is not None:  # a job's own webhook just ends
                await webhooks.disable(endpoint.endpoint_id, "the receiver answered 410 Gone")
            metrics.WEBHOOKS.labels(outcome="failed").inc()
            return FAILED
        await webhooks.tried(delivery.delivery_id, status=status, error=error)
        metrics.WEBHOOKS.labels(outcome="retried").inc()
        raise ApplicationError(f"not delivered: {error}", type=UNDELIVERED)

    @activity.defn(name="webhook_gave_up")
    async def webhook_gave_up(self, delivery_id: str) -> None:
        """The delivery's tries are over: it ends `failed`; and its endpoint, if nothing
        reached it over those days, is disabled (its org sees why in GET /v1/webhooks); a
        job's own webhook has no endpoint to disable."""
        webhooks = self.store.webhooks
        await webhooks.gave_up(delivery_id, "its tries are over (about three days)")
        metrics.WEBHOOKS.labels(outcome="failed").inc()
        to_send = await webhooks.to_send(delivery_id)
        if to_send is None or to_send.endpoint is None:
            return
        since = to_send.delivery.created_at
        if not await webhooks.delivered_since(to_send.endpoint.endpoint_id, since):
            reason = (
                f"nothing delivered since {since:%Y-%m-%d %H:%M} UTC: every try failed for "
                "days; fix the receiver, then enable it again (PATCH with enabled: true) and "
                "redeliver what failed"
            )
            await webhooks.disable(to_send.endpoint.endpoint_id, reason)
            activity.logger.warning(
                "webhook endpoint %s of org %s disabled: %s",
                to_send.endpoint.endpoint_id,
                to_send.endpoint.org,
                reason,
            )


def _host(url: str) -> str:
    try:
        return httpx.URL(url).host
    except httpx.InvalidURL:
        return url


async def _head_of(answer: httpx.Response) -> str:
    """The first KEPT_BODY_BYTES of a response, as text (the rest is not read)."""
    kept = b""
    async for chunk in answer.aiter_raw():
        kept += chunk
        if len(kept) >= KEPT_BODY_BYTES:
            break
    return kept[:KEPT_BODY_BYTES].decode(errors="replace").strip()
