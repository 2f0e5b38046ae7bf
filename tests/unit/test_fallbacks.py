"""Provider fallbacks' rules, without a service: when a failure moves a job on to its next
place (the lifecycle's `next_step`), what a provider's client error says, and a job's places
as its options name them."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.adapters.base import InvalidOptions
from activities.adapters.chat import client_reason
from activities.adapters.options import PromptOptions, on_target, targets
from activities.adapters.routes import InvalidRoutes, Place, read_routes
from projections.domain.lifecycle import (
    BackoffPolicy,
    End,
    ErrorKind,
    FailedAttempt,
    Reason,
    Retry,
    next_step,
)
from promptjobs.runtime import build_adapters
from tests.conftest import make_settings

POLICY = BackoffPolicy(initial_s=5.0, coefficient=5.0, jitter=0.0)


def step(kind: ErrorKind, attempt: int = 1, max_attempts: int = 5, **failure: object) -> object:
    return next_step(
        FailedAttempt(kind, "it failed", attempt, max_attempts, **failure),  # type: ignore[arg-type]
        policy=POLICY,
        now_s=0.0,
        deadline_s=float("inf"),
        unit_random=0.5,
    )


def test_an_outage_is_retried_in_place_once_then_moves_on_at_once() -> None:
    first = step(ErrorKind.PROVIDER_5XX, elsewhere=True, outage_streak=1)
    assert first == Retry(5.0)  # a blip, most likely: the same place after the backoff
    second = step(ErrorKind.PROVIDER_5XX, 2, elsewhere=True, outage_streak=2)
    assert second == Retry(1.0, "the provider failed 2 times in a row (provider_5xx)")
    timed_out = step(ErrorKind.TIMEOUT, 2, elsewhere=True, outage_streak=2)
    assert isinstance(timed_out, Retry) and timed_out.moved_on is not None


def test_without_a_place_to_move_to_a_failure_is_what_it_always_was() -> None:
    assert step(ErrorKind.PROVIDER_5XX, 2, outage_streak=2) == Retry(25.0)
    refused = step(ErrorKind.PROVIDER_4XX, reason=Reason.CONTEXT_LENGTH)
    assert refused == End(ErrorKind.PROVIDER_4XX, "it failed")


def test_a_client_error_another_place_may_not_make_moves_on_at_once() -> None:
    too_long = step(ErrorKind.PROVIDER_4XX, elsewhere=True, reason=Reason.CONTEXT_LENGTH)
    assert too_long == Retry(1.0, "the request is over the model's context window")
    gone = step(ErrorKind.PROVIDER_4XX, elsewhere=True, reason=Reason.MODEL_GONE)
    assert gone == Retry(1.0, "the provider does not serve the model")
    # Any other client error is the request's own: no place would take it.
    assert step(ErrorKind.PROVIDER_4XX, elsewhere=True) == End(ErrorKind.PROVIDER_4XX, "it failed")
    assert step(ErrorKind.AUTH, elsewhere=True) == End(ErrorKind.AUTH, "it failed")


@pytest.mark.parametrize(
    "kind", [ErrorKind.RATE_LIMIT, ErrorKind.SCHEMA_MISMATCH, ErrorKind.UNKNOWN]
)
def test_a_busy_provider_or_a_bad_answer_does_not_move_the_job(kind: ErrorKind) -> None:
    stayed = step(kind, 2, elsewhere=True, outage_streak=2)
    assert isinstance(stayed, Retry) and stayed.moved_on is None


def test_moving_on_spends_an_attempt_like_any_failure() -> None:
    last = step(ErrorKind.PROVIDER_5XX, 3, 3, elsewhere=True, outage_streak=2)
    assert last == End(ErrorKind.PROVIDER_5XX, "it failed")


@pytest.mark.parametrize(
    ("status", "said", "reason"),
    [
        (
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens.",
            Reason.CONTEXT_LENGTH,
        ),
        (400, "prompt is too long: 210000 tokens > 200000 maximum", Reason.CONTEXT_LENGTH),
        (413, "Request exceeds the context window", Reason.CONTEXT_LENGTH),
        (
            404,
            "The model `gpt-9` does not exist or you do not have access to it.",
            Reason.MODEL_GONE,
        ),
        (404, "model: claude-9", Reason.MODEL_GONE),
        (400, "temperature: must be at most 2", None),
        (404, "Not Found", None),
        (500, "context length exceeded while the server crashed", None),
    ],
)
def test_what_a_providers_client_error_says(status: int, said: str, reason: Reason | None) -> None:
    assert client_reason(status, said) is reason


def test_a_jobs_places_are_its_own_then_its_fallbacks_round_again() -> None:
    options = PromptOptions.model_validate(
        {
            "provider": "openai",
            "model": "gpt-4o",
            "temperature": 0.2,
            "fallbacks": [{"provider": "anthropic", "model": "claude-x"}, {"provider": "fake"}],
        }
    )
    places = [(o.provider, o.model, o.temperature) for o in targets(options)]
    assert places == [
        ("openai", "gpt-4o", 0.2),
        ("anthropic", "claude-x", 0.2),
        ("fake", None, 0.2),  # the provider's default model
    ]
    assert on_target(options, 0) is options
    assert (on_target(options, 2).provider, on_target(options, 3).provider) == ("fake", "openai")


def test_each_fallback_is_checked_at_the_door_and_named_when_wrong(tmp_path: Path) -> None:
    adapters = build_adapters(make_settings(tmp_path))
    adapters.validate({"provider": "fake", "fallbacks": [{"provider": "fake", "model": "b"}]})
    with pytest.raises(InvalidOptions) as unknown:
        adapters.validate({"provider": "fake", "fallbacks": [{"provider": "nowhere"}]})
    assert str(unknown.value).startswith("options.fallbacks[0]: unknown provider 'nowhere'")
    with pytest.raises(InvalidOptions) as too_many:
        adapters.validate({"fallbacks": [{"provider": "fake"}] * 5})
    assert "options.fallbacks" in str(too_many.value)


ROUTES = """
[routes]
smart = ["openai/gpt-4o", "anthropic/claude-x", "fake"]
"meta:llama" = ["openai/meta-llama/Llama-3.1-8B"]
"""


def test_a_route_is_its_places_in_order(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(ROUTES)
    routes = read_routes(path)
    assert [str(p) for p in routes["smart"]] == ["openai/gpt-4o", "anthropic/claude-x", "fake"]
    # The model is everything after the provider's slash.
    assert routes["meta:llama"] == [Place("openai", "meta-llama/Llama-3.1-8B")]


def test_a_job_naming_a_route_stores_what_it_named(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(ROUTES)
    adapters = build_adapters(make_settings(tmp_path, routes_file=path))
    assert adapters.expand({"route": "smart", "temperature": 0.5}) == {
        "provider": "openai",
        "model": "gpt-4o",
        "temperature": 0.5,
        "fallbacks": [{"provider": "anthropic", "model": "claude-x"}, {"provider": "fake"}],
    }
    assert adapters.expand({"provider": "fake"}) == {"provider": "fake"}
    with pytest.raises(InvalidOptions) as unknown:
        adapters.expand({"route": "clever"})
    said = "options.route: unknown route 'clever'; the routes: meta:llama, smart"
    assert str(unknown.value) == said
    with pytest.raises(InvalidOptions) as beside:
        adapters.expand({"route": "smart", "model": "gpt-4o-mini"})
    assert "leave out model" in str(beside.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[routes]\nsmart = ", "is not TOML"),
        ('[routes]\n"a b" = ["fake"]', "routes.a b"),
        ("[routes]\nsmart = []", "routes.smart"),
        ('[routes]\nsmart = ["fake", "fake", "fake", "fake", "fake", "fake"]', "1 to 5 places"),
        ('[route]\nsmart = ["fake"]', "expected a [routes] table"),
    ],
)
def test_a_routes_file_that_cannot_be_used_says_why(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(text)
    with pytest.raises(InvalidRoutes) as bad:
        read_routes(path)
    assert str(bad.value).startswith(f"the routes file {path}")
    assert says in str(bad.value)


def test_a_route_through_a_provider_the_deployment_lacks_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_text('[routes]\nsmart = ["openia/gpt-4o"]')
    with pytest.raises(InvalidRoutes) as bad:
        build_adapters(make_settings(tmp_path, routes_file=path))
    assert str(bad.value).startswith("route 'smart': unknown provider 'openia' in 'openia/gpt-4o'")
