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
