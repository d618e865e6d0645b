"""The token view of one trajectory: every ledger token with its marks, and a re-render check.

    record (Trajectory.to_dict() + trainer_logprobs) + ChatTemplate (the run's tokenizer)
        -> per segment: [{id, text, mask, lp, tlp, version}] + where the ledger and a re-render
           of the messages first differ (``ChatTemplate.check_ledger``)

Without a tokenizer the tokens show as ids and no check is made. The check renders each
segment's conversation prefix with the assistant messages replaced by their raw completions
(``Trajectory.turns``, as ``TokenLedger.check`` does), trying the longest prefix first. The
tool schemas the model was shown are not in the record: the check renders without tools, and
again with the schemas of the env class's ``tools`` (a class attribute, looked up in the env
registry) when there are some; a difference inside the first prompt that remains may be
due to tools an env sets per instance, and is reported as such.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from agentrl.chat import ChatTemplate, LedgerCheck
from agentrl.types import JSON, Message, Turn

logger = logging.getLogger(__name__)

MAX_CHECK_RENDERS = 64
"""Conversation prefixes tried per segment before the check gives up."""


def find_tokenizer(path: Path) -> Path | None:
    """The tokenizer a run was trained with: its SFT model, its base model, or config's model.path."""
    for d in (path, *path.parents[:3]):
        if not d.is_dir():
            continue
        for name in ("sft_model", "base_model", "hf"):
            if (d / name / "tokenizer_config.json").is_file():
                return d / name
        cfg = d / "config.yaml"
        if cfg.is_file():
            import yaml

            model = (yaml.safe_load(cfg.read_text()) or {}).get("model") or {}
            p = Path(str(model.get("path") or ""))
            if model.get("path") and (p / "tokenizer_config.json").is_file():
                return p
    return None


def load_template(path: Path | None) -> ChatTemplate | None:
    if path is None:
        return None
    try:
        return ChatTemplate.from_pretrained(path)
    except Exception as e:  # a broken tokenizer directory must not stop the viewer
        logger.warning("no token texts: could not load a tokenizer from %s: %s", path, e)
        return None


def token_view(record: dict[str, Any], template: ChatTemplate | None) -> dict[str, Any]:
    """Segments of tokens with mask, rollout/trainer logprobs, version and the check result."""
    segs = record.get("segments") or []
    trainer = record.get("trainer_logprobs") or []
    advs = record.get("advantages") or []
    token_advs = record.get("token_advantages") or []
    out = []
    for k, seg in enumerate(segs):
        ids: list[int] = seg["token_ids"]
        tlp = trainer[k] if k < len(trainer) else None
        seg_adv = advs[k] if k < len(advs) else None
        tadv = token_advs[k] if k < len(token_advs) else None
        texts = _texts(ids, template)
        tokens = [
            {
                "id": t,
                "text": texts[i],
                "mask": seg["loss_mask"][i],
                "lp": seg["logprobs"][i],
                "tlp": tlp[i] if tlp is not None and i < len(tlp) else None,
                "version": seg["versions"][i],
                "adv": (tadv[i] if tadv is not None and i < len(tadv) else seg_adv)
                if seg["loss_mask"][i]
                else None,
            }
            for i, t in enumerate(ids)
        ]
        out.append(
            {
                "index": k,
                "advantage": seg_adv,
                "tokens": tokens,
                "check": _check(record, k, template),
            }
        )
    return {"id": record.get("id"), "tokenizer": template is not None, "segments": out}


def _texts(ids: list[int], template: ChatTemplate | None) -> list[str]:
    if template is None:
        return [f"<{i}>" for i in ids]
    tok = template.tokenizer
    return [str(s) for s in tok.batch_decode([[i] for i in ids], skip_special_tokens=False)]


def _check(record: dict[str, Any], k: int, template: ChatTemplate | None) -> dict[str, Any]:
    """Where segment ``k`` first differs from a re-render of its messages (or that it does not)."""
    if template is None:
        return {"done": False, "why": "no tokenizer (pass --tokenizer)"}
    try:
        messages = [Message.from_openai(m) for m in record.get("messages") or []]
        turns = [Turn.from_dict(t) for t in record.get("turns") or []]
        ids = record["segments"][k]["token_ids"]
        raw = _with_raw_completions(messages, turns, template)
        env_id = str((record.get("sample") or {}).get("env_id", ""))
        best: LedgerCheck | None = None
        for attempt in range(2):  # without tools, then with the env class's (looked up lazily)
            tools = env_tool_schemas(env_id) if attempt else None
            if attempt and tools is None:
                break
            for n in range(len(raw), 0, -1)[:MAX_CHECK_RENDERS]:
                res = template.check_ledger(raw[:n], ids, tools)
                if res.ok:
                    return {"done": True, "ok": True}
                if best is None or _reach(res) > _reach(best):
                    best = res
        if best is None or best.mismatch is None:
            return {"done": False, "why": "no messages to render"}
        m = best.mismatch
        first_gen = next((i for i, x in enumerate(record["segments"][k]["loss_mask"]) if x), None)
        in_prompt = first_gen is not None and m.token_index < first_gen
        return {
            "done": True,
            "ok": False,
            "token_index": m.token_index,
            "expected": m.expected,
            "got": m.got,
            "note": "inside the first prompt: may be tool schemas the env set per instance, "
            "which the record does not keep"
            if in_prompt
            else "",
        }
    except Exception as e:  # a record the template cannot render: say so, show the tokens
        return {"done": False, "why": f"{type(e).__name__}: {e}"}


def env_tool_schemas(env_id: str) -> list[JSON] | None:
    """The tool schemas of a registered env's class (``tools`` set on the class), or None."""
    from agentrl.env import ENVS
    from agentrl.tool import ToolSet

    try:
        tools = getattr(ENVS.spec(env_id).load(), "tools", None)
    except Exception:  # unknown id, a module that no longer imports: check without tools
        return None
    return tools.schemas() if isinstance(tools, ToolSet) and len(tools) else None


def _reach(res: LedgerCheck) -> int:
    return res.mismatch.char_index if res.mismatch is not None else 1 << 30


def _with_raw_completions(
    messages: list[Message], turns: list[Turn], template: ChatTemplate
) -> list[Message]:
    """Assistant message j becomes the raw text of completion j (what the ledger holds)."""
    out, j = [], 0
    for m in messages:
        if m.role == "assistant" and j < len(turns):
            m = Message(role="assistant", content=template.completion_text(turns[j].completion_ids))
            j += 1
        out.append(m)
    return out
