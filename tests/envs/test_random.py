"""The envs' counter-based random stream: distribution, seeding, state, and compiled == eager."""

import math

import pytest
import torch

from envs.random import CounterRandom, splitmix64


def test_uniform_and_normal_moments():
    rng = CounterRandom(0, "cpu")
    u = rng.rand(400_000)
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 3e-3 and abs(u.var().item() - 1 / 12) < 1e-3
    n = rng.randn(400_000)
    assert abs(n.mean().item()) < 1e-2 and abs(n.std().item() - 1) < 1e-2
    # Two-sided 3-sigma tail of a normal: 0.27%.
    assert abs((n.abs() > 3).float().mean().item() - 0.0027) < 5e-4
    k = rng.randint(5, 100_000)
    assert set(k.unique().tolist()) == {0, 1, 2, 3, 4}


def test_consecutive_draws_are_uncorrelated():
    x = CounterRandom(3, "cpu").rand(200_001)
    assert abs(torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1].item()) < 0.01


def test_seeding_and_state():
    a, b, c = CounterRandom(1, "cpu"), CounterRandom(1, "cpu"), CounterRandom(2, "cpu")
    assert torch.equal(a.rand(10), b.rand(10)) and not torch.equal(a.rand(10), c.rand(10))
    state = a.state_dict()
    first = a.rand(5)
    a.load_state_dict(state)
    assert torch.equal(a.rand(5), first)
    a.seed(1)
    assert torch.equal(a.rand(10), CounterRandom(1, "cpu").rand(10))
    assert a.counter.item() == 5  # 64-bit draws: two uniforms from each
    a.bits32(3)
    assert a.counter.item() == 7  # an odd count still takes whole 64-bit draws


def test_every_bit_of_the_32_bit_halves_is_fair():
    bits = CounterRandom(7, "cpu").bits32(100_001)
    ones = torch.stack([(bits >> k) & 1 for k in range(32)]).float().mean(1)  # [32]
    assert ((ones - 0.5).abs() < 0.006).all(), ones  # 5 sigma at 100k draws is 0.008


def test_splitmix64_matches_its_definition():
    """The 64-bit arithmetic, checked against Python integers."""
    mask = (1 << 64) - 1

    def reference(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    values = [0, 1, 12345, (1 << 63) + 7, mask]
    signed = torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values], dtype=torch.int64)
    got = [(int(x) + (1 << 64)) % (1 << 64) for x in splitmix64(signed)]
    assert got == [reference(v) for v in values]

    # A stream is SplitMix64's generator started at its key: the state moves by the golden gamma before each
    # hash, so no draw hashes the key alone (seed 0's key is 0, and the hash of 0 is 0: its first draw was 0).
    for seed in (0, 1, 12345):
        state = reference(seed)
        expected = []
        for _ in range(4):
            state = (state + 0x9E3779B97F4A7C15) & mask
            expected.append(reference(state))
        got = [(int(x) + (1 << 64)) % (1 << 64) for x in CounterRandom(seed, "cpu").bits(4)]
        assert got == expected, seed
    assert (CounterRandom(0, "cpu").rand(4) > 0).all()


def test_compiled_draws_equal_eager_ones():
    def draw(rng):
        return rng.rand(4, 3), rng.randint(7, 5), rng.randn(6)

    eager, compiled = CounterRandom(5, "cpu"), CounterRandom(5, "cpu")
    step = torch.compile(draw, fullgraph=True)
    for _ in range(3):
        for x, y in zip(draw(eager), step(compiled)):
            torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-6)
    assert eager.counter.item() == compiled.counter.item() == 3 * (6 + 3 + 6)  # 64-bit draws: two uniforms each
    assert math.isfinite(eager.randn(10).sum().item())


def test_sizes_given_torch_style_are_a_clear_error():
    rng = CounterRandom(0, "cpu")
    with pytest.raises(TypeError, match=r"random sizes are separate ints, e.g\. rng\.rand\(B, n\).*got \(5, \(4,\)\)"):
        rng.randint(0, 5, (4,))  # torch.randint's (low, high, size) order
    assert rng.randint(5, 4, 2).shape == (4, 2)


def test_member_streams_draw_as_single_streams_with_their_seeds():
    seeds = [3, 7, 11]
    batched, singles = CounterRandom(seeds, "cpu"), [CounterRandom(s, "cpu") for s in seeds]
    for _ in range(2):
        assert torch.equal(batched.rand(6, 5, 2), torch.cat([r.rand(2, 5, 2) for r in singles]))
        assert torch.equal(batched.bits32(9, 3), torch.cat([r.bits32(3, 3) for r in singles]))  # odd count
        assert torch.equal(batched.randn(3, 5), torch.cat([r.randn(1, 5) for r in singles]))
        assert torch.equal(batched.randint(4, 6), torch.cat([r.randint(4, 2) for r in singles]))
    assert batched.counter.item() == singles[0].counter.item()
    with pytest.raises(ValueError, match=r"needs dim 0 \(the env dim\) divisible by 3"):
        batched.rand(4, 2)
    with pytest.raises(ValueError, match="this stream takes 3 seed"):
        batched.seed(5)
