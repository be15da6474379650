"""bench/harness/pyspy.py: the reading of py-spy's collapsed stacks."""

from bench.harness.pyspy import collapsed, frame_name, summarise


def test_collapsed_stacks_are_summed_per_thread_and_per_function(tmp_path):
    raw = tmp_path / "x.txt"
    raw.write_text("thread (1): engine;_loop (app/engine/engine.py:380);decode (app/engine/llama.py:40) 30\n"
                   "thread (1): engine;_loop (app/engine/engine.py:390);_sample (app/engine/engine.py:770) 10\n"
                   "thread (2): loop;send (uvicorn/x.py:5) 60\n"
                   "garbage line\n")
    stacks = collapsed(raw)
    assert sum(stacks.values()) == 100
    lines = summarise(stacks)
    assert lines[0].split() == ["60", "samples", "60.0%", "thread", "(2):", "loop"]
    # _loop counted once per stack however many lines of it appear
    assert any(line.split()[0] == "40" and line.endswith("_loop (engine.py)") for line in lines)


def test_frame_names_drop_the_line_number():
    assert frame_name("decode (app/engine/llama.py:40)") == "decode (llama.py)"
