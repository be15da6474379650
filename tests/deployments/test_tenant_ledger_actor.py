"""The ledger actor's own code and its client, called as Ray would (no Ray started): verdicts and usage
cross back, a dead actor is looked up again and meanwhile the gate counts per replica, and a restarted
actor finds the usage its predecessor saved."""

from __future__ import annotations

import asyncio
import pickle

from ray import exceptions as ray_exc

from app.tenants.gate import TenantGate
from app.tenants.ledger import Usage
from app.tenants.policies import KeyPolicy, TokenBudget, key_hash
from app.config.app_args import AuthConfig
from deployments.tenant_ledger import LEDGER_ACTOR, ActorLedger, LedgerActor, ledger_actors

POLICY = KeyPolicy(name="team", key_sha256=key_hash("k"), requests_per_minute=2,
                   token_budget=TokenBudget(tokens=100, per="month"))


class Method:
    def __init__(self, actor: "FakeActor", name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args):
        async def call():
            if self.actor.dead:
                raise ray_exc.ActorDiedError()
            args_copy = pickle.loads(pickle.dumps(args))  # what crosses to the actor must pickle
            return pickle.loads(pickle.dumps(getattr(self.actor.inner, self.name)(*args_copy)))
        return call()


class FakeActor:
    def __init__(self, url: str | None = None) -> None:
        self.inner = LedgerActor.__ray_actor_class__(url, save_every_s=3600)
        self.dead = False

    def __getattr__(self, name: str) -> Method:
        return Method(self, name)


def test_two_replicas_share_one_actor_and_a_restarted_actor_keeps_usage(tmp_path) -> None:
    url = str(tmp_path / "usage.json")
    first = FakeActor(url)
    found = [first]

    def lookup():  # what Serve's controller has under the name: the first actor, then its replacement
        return found[0] if not found[0].dead else FakeActor(url)

    async def run():
        client = ActorLedger(lookup)
        gates = [TenantGate(client, replicas=2), TenantGate(client, replicas=2)]
        tickets = [await gates[0].admit(POLICY), await gates[1].admit(POLICY), await gates[1].admit(POLICY)]
        assert [t.verdict.admitted for t in tickets] == [True, True, False]
        await gates[0].settle(tickets[0], "m", Usage(1, 30, 0, 10))
        first.inner.save()
        first.dead = True  # the controller starts a new actor, which reads what the first saved
        report = await client.usage_report()
        assert report["keys"]["team"]["models"]["m"]["prompt_tokens"] == 30
        await client.admit(POLICY)
        assert (await client.usage_report())["keys"]["team"]["budget"]["used"] == 40
    asyncio.run(run())


def test_the_gate_counts_per_replica_while_the_actor_is_gone() -> None:
    actor = FakeActor()
    actor.dead = True

    async def run():
        gate = TenantGate(ActorLedger(lambda: actor), replicas=2)
        verdicts = [(await gate.admit(POLICY)).verdict.admitted for _ in range(3)]
        assert verdicts == [True, False, False] and gate.degraded  # 2 per minute, halved
    asyncio.run(run())


def test_the_processing_deployment_gets_the_ledger_actor_with_a_keys_file() -> None:
    [config] = ledger_actors(AuthConfig(api_keys_file="/etc/keys.yaml", usage_snapshot="/tmp/usage.json"))
    assert config.name == LEDGER_ACTOR and config.init_kwargs == {"snapshot_url": "/tmp/usage.json"}
    assert ledger_actors(AuthConfig()) == []  # keys from the environment only: no limits to share
