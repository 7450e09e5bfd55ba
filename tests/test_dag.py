"""docs/dag.md's folded graph: one node per stage family, an edge wherever any member feeds another family."""

from bench.dag import folded, page, parse

MERMAID = """flowchart TD
\tnode1["data@a"]
\tnode2["data@b"]
\tnode3["train@vit"]
\tnode4["train@resnet"]
\tnode5["report"]
\tnode1-->node3
\tnode2-->node3
\tnode2-->node4
\tnode3-->node5
\tnode4-->node5
"""


def test_parse_reads_every_node_and_edge():
    nodes, edges = parse(MERMAID)
    assert sorted(nodes.values()) == ["data@a", "data@b", "report", "train@resnet", "train@vit"]
    assert len(edges) == MERMAID.count("-->")


def test_folded_keeps_family_edges_once():
    out = folded(MERMAID)
    nodes, edges = parse(out)
    assert sorted(nodes.values()) == ["data@*<br/>a, b", "report", "train@*<br/>resnet, vit"]
    names = {(nodes[a].split("@")[0], nodes[b].split("@")[0]) for a, b in edges}
    assert sorted(names) == [("data", "train"), ("train", "report")] and len(edges) == len(names)


def test_page_holds_both_graphs():
    text = page(MERMAID)
    assert text.count("```mermaid") == 2 and MERMAID.strip() in text


def test_no_tracked_file_inside_a_dvc_output():
    """DVC refuses to write a cached output that git tracks (say, a stale .gitignore of a stage that is gone);
    ``cache: false`` outputs (``reports/``) are committed on purpose."""
    import subprocess
    from pathlib import Path

    from dvc.repo import Repo

    root = Path(__file__).resolve().parents[1]
    outs = sorted({str(Path(o.fs_path).relative_to(root)) for o in Repo(str(root)).index.outs if o.use_cache})
    tracked = subprocess.run(["git", "ls-files", "--", *outs], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()
    assert outs and tracked == []
