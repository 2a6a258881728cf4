"""Host-side engine logic: chunking, setup grouping, the estimator cache's frame map."""

from __future__ import annotations

from minicpm_speech_runtime.engine.config import EngineConfig
from minicpm_speech_runtime.engine.scheduler import Scheduler
from minicpm_speech_runtime.engine.state import EndReason, FrameMap, Phase, StreamState


def _stream(i: int, now: float = 0.0) -> StreamState:
    return StreamState(f"s{i}", None, f"v{i}", 100, i, now)


def test_host_modules_import_no_torch() -> None:
    import ast
    from pathlib import Path

    import minicpm_speech_runtime.engine as engine

    for name in ("scheduler.py", "state.py", "config.py"):
        tree = ast.parse((Path(engine.__file__).parent / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "torch" for a in node.names), name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "torch", name


def test_chunks_keep_lookahead_until_last() -> None:
    s = _stream(0)
    s.push(list(range(60)), False, 0.0)
    sizes = []
    while (c := s.ready_chunk()) is not None:
        sizes.append(len(c.tokens))
        s.consume(c)
    assert sizes == [28, 28] and len(s.tokens) == 10
    s.push([], True, 1.0)
    last = s.ready_chunk()
    assert last is not None and last.last and len(last.tokens) == 10


def test_a_last_remainder_of_one_chunk_and_its_lookahead_is_one_chunk() -> None:
    """A final window of 25 new tokens leaves 25 + 3 once the last token came: one last chunk,
    so the step that gets that window finishes the stream; one token more takes two."""
    for total, sizes in ((53, [28, 28]), (54, [28, 28, 4])):
        s = _stream(0)
        s.push(list(range(total)), True, 0.0)
        got = []
        while (c := s.ready_chunk()) is not None:
            got.append((len(c.tokens), c.last))
            s.consume(c)
        assert [n for n, _ in got] == sizes, total
        assert [last for _, last in got] == [False] * (len(sizes) - 1) + [True], total


def test_bad_token_and_empty_end_the_stream() -> None:
    assert _stream(0).push([1, 6561], False, 0.0) is EndReason.BAD_TOKEN
    assert _stream(1).push([-1], False, 0.0) is EndReason.BAD_TOKEN
    assert _stream(2).push([], True, 0.0) is EndReason.EMPTY


def test_setup_groups_bounded_and_in_arrival_order() -> None:
    sched = Scheduler(EngineConfig(max_streams=8, micro_batch=3))
    for i in (4, 0, 2, 1, 3):
        sched.add(_stream(i))
    plan = sched.plan(0.0, max_setups=8)
    assert [[s.order for s in g] for g in plan.setup_groups] == [[0, 1, 2], [3, 4]]


def test_setup_groups_gather_similar_prompt_lengths() -> None:
    sched = Scheduler(EngineConfig(max_streams=8, micro_batch=2))
    for i, frames in enumerate([480, 120, 500, 130]):
        st = _stream(i)
        st.prompt_frames = frames
        sched.add(st)
    plan = sched.plan(0.0, max_setups=8)
    assert [[s.order for s in g] for g in plan.setup_groups] == [[1, 3], [0, 2]]


def test_cached_voices_hit_and_same_voice_streams_follow_their_leader() -> None:
    sched = Scheduler(EngineConfig(max_streams=8, micro_batch=2))
    voices = ["v0", "v1", "v0", "v2", "v1", "v3"]
    for i, v in enumerate(voices):
        st = _stream(i)
        st.voice_key = v
        sched.add(st)
    plan = sched.plan(0.0, max_setups=8, cached={"v2"})
    assert [s.order for s in plan.setup_hits] == [3]
    assert [[s.order for s in g] for g in plan.setup_groups] == [[0, 1], [5]]
    assert [(s.order, lead.order) for s, lead in plan.setup_followers] == [(2, 0), (4, 1)]


def test_idle_timeout_and_cancel() -> None:
    sched = Scheduler(EngineConfig(idle_timeout_s=5.0))
    a, b = _stream(0), _stream(1)
    a.phase = b.phase = Phase.LIVE
    sched.add(a)
    sched.add(b)
    sched.cancelled.add("s1")
    plan = sched.plan(10.0, 8)
    assert [(s.stream_id, r) for s, r in plan.ending] == [
        ("s0", EndReason.IDLE_TIMEOUT),
        ("s1", EndReason.CANCELLED),
    ]


def _reference_lengths(prompt: int, chunks: list[int]) -> list[list[str]]:
    """The reference's cache as a list of frame labels: prepend, then cut to prompt + 100."""
    cache = [f"p{i}" for i in range(prompt)]
    states = []
    for c, n in enumerate(chunks):
        cache = [f"c{c}.{i}" for i in range(n)] + cache
        if len(cache) > prompt + 100:
            cache = cache[:prompt] + cache[-100:]
        states.append(cache)
    return states


def test_frame_map_keeps_the_reference_frames() -> None:
    for prompt in (40, 150, 300):
        fm = FrameMap(prompt, prompt + 100 + 56)
        label: dict[int, str] = {p: f"p{p}" for p in fm.setup()}
        chunks = [50] * 9 + [12]
        for c, (n, want) in enumerate(zip(chunks, _reference_lengths(prompt, chunks), strict=True)):
            for i, p in enumerate(fm.append_chunk(n)):
                label[p] = f"c{c}.{i}"
            fm.truncate()
            assert [label[p] for p in fm.logical] == want
            assert len(set(fm.logical)) == len(fm.logical)
            assert not set(fm.logical) & set(fm.free)
