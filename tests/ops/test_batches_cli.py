"""`llamaray batches` over a server's HTTP API (the app's test client, a store in a temporary folder): a key's
batches listed with their progress, one shown and cancelled, its output file written where asked, and a refusal
said in one line with the server's status."""

from __future__ import annotations

import json

from app.batches.records import BatchRecord, batch_record_path
from app.ops.batches_cli import run
from app.ops.cli import main
from tests.http.test_batch_routes import DATA, KEY_A, client_over, sdk


def args(*argv: str):
    import argparse

    from app.ops import batches_cli

    parser = argparse.ArgumentParser()
    batches_cli.add_parser(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["batches", "--key", KEY_A, *argv])


def test_list_show_cancel_and_results(tmp_path, capsys):
    from app.batches.store import BatchStore

    store = BatchStore(str(tmp_path / "store"))
    with client_over(store) as c:
        client = sdk(c)
        file = client.files.create(file=("in.jsonl", DATA), purpose="batch")
        batch = client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert run(args("list"), c) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].split()[:2] == ["id", "status"] and table[1].split()[:2] == [batch.id, "validating"]
        assert run(args("show", batch.id), c) == 0
        assert json.loads(capsys.readouterr().out)["id"] == batch.id
        assert run(args("results", batch.id, "-o", str(tmp_path / "out")), c) == 1  # nothing written yet
        capsys.readouterr()
        # The batch ended with an output file (the runner's work, written here by hand).
        owner = store.names("keys")[0]
        record = BatchRecord.from_json(store.get(batch_record_path(owner, batch.id)))
        record.output_file_id = file.id
        record.set_status("completed")
        store.put(batch_record_path(owner, batch.id), record.to_json())
        assert run(args("results", batch.id, "-o", str(tmp_path / "out")), c) == 0
        assert (tmp_path / "out" / f"{batch.id}_output.jsonl").read_bytes() == DATA
        assert run(args("cancel", batch.id), c) == 1
        assert "409" in capsys.readouterr().err
        assert run(args("show", "batch_" + "0" * 32), c) == 1
        assert "404" in capsys.readouterr().err


def test_an_unreachable_server_is_one_line(capsys):
    assert main(["batches", "--url", "http://127.0.0.1:9", "list"]) == 2
    assert capsys.readouterr().err.startswith("llamaray batches: http://127.0.0.1:9")
