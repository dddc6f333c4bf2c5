import asyncio

from lorabind.runtime.scale_out.scheduling import MAX_PASSED_OVER, BindingFirstTurns


def test_binding_first_with_a_fairness_bound():
    async def body():
        turns = BindingFirstTurns()
        order = []
        async def prompt(fp, i):
            await turns.acquire(fp)
            order.append(f"{fp}{i}")
            await asyncio.sleep(0)
            await turns.release(fp)
        await turns.acquire("A")  # the replica is busy with an A prompt while the rest arrive
        tasks = [asyncio.ensure_future(prompt(fp, i)) for i, fp in enumerate("CACACACA")]
        await asyncio.sleep(0.01)
        await turns.release("A")
        await asyncio.gather(*tasks)
        return order
    order = asyncio.run(body())
    # A's run first while they wait; the first C is passed over at most MAX_PASSED_OVER times.
    assert order[:MAX_PASSED_OVER] == ["A1", "A3", "A5"] and order[MAX_PASSED_OVER] == "C0"
    assert sorted(order) == sorted(f"{fp}{i}" for i, fp in enumerate("CACACACA"))


def test_a_replica_of_max_batch_n_runs_n_prompts_at_once_binding_first():
    async def body():
        turns = BindingFirstTurns(capacity=2)
        order, finish = [], asyncio.Event()

        async def prompt(fp, i):
            await turns.acquire(fp)
            order.append(f"{fp}{i}")
            await finish.wait()
            await turns.release(fp)

        await turns.acquire("A")  # one A prompt runs, a second slot is free
        tasks = [asyncio.ensure_future(prompt(fp, i)) for i, fp in enumerate("CAC")]
        for _ in range(20):
            await asyncio.sleep(0)
        admitted_beside_a = list(order)
        await turns.release("A")  # the replica now holds A: the waiting A goes before the later C
        for _ in range(20):
            await asyncio.sleep(0)
        admitted = list(order)
        finish.set()
        await asyncio.gather(*tasks)
        return admitted_beside_a, admitted, order

    beside_a, admitted, order = asyncio.run(body())
    assert beside_a == ["C0"]  # the free slot takes the oldest
    assert admitted == ["C0", "A1"]  # two at once, binding-first
    assert order == ["C0", "A1", "C2"]
