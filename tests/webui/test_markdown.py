"""The chat page's markdown (runner/webui/markdown.js) as Chromium renders it: exact HTML, always escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.model
CODE_BAR = '<div class="code-bar"><span>{}</span><button type="button" class="copy">Copy</button></div>'

# model output -> the reply's HTML
RENDERED = {
    # a lone * with spaces around it is no emphasis (CommonMark's flanking rule)
    "2 * 3 * 4 = 24": "<p>2 * 3 * 4 = 24</p>",
    "a*b*c, *em* and x * y": "<p>a<em>b</em>c, <em>em</em> and x * y</p>",
    "**bold with * star** and *a * b*": "<p><strong>bold with * star</strong> and <em>a * b</em></p>",
    "**`code` in bold**": "<p><strong><code>code</code> in bold</strong></p>",
    # list items apart by blank lines are one list; a list starting at 3 is numbered from 3
    "1. first\n\n2. second\n\n3. third": "<ol><li>first</li><li>second</li><li>third</li></ol>",
    "3. third\n4. fourth": '<ol start="3"><li>third</li><li>fourth</li></ol>',
    "1. step\n   - detail\n2. next\n\nafter": "<ol><li>step<ul><li>detail</li></ul></li><li>next</li></ol><p>after</p>",
    "- a\n1. b": "<ul><li>a</li></ul><ol><li>b</li></ol>",
    # a fence with more than the language after it still opens (and its closing fence closes) a block
    '```python title="x.py"\nprint(1)\n```\nafter': (
        f'<div class="code-block">{CODE_BAR.format("python")}<pre><code>print(1)</code></pre></div><p>after</p>'),
    "````\n```\ninner\n```\n````": f'<div class="code-block">{CODE_BAR.format("code")}<pre><code>```\ninner\n```'
                                   "</code></pre></div>",
    # escaped, whatever the construct
    '**<img src=x onerror="window.__pwned = 1">**': (
        '<p><strong>&lt;img src=x onerror="window.__pwned = 1"&gt;</strong></p>'),
    "3. <script>window.__pwned = 2</script>\n   - *<b>x</b>*": (
        '<ol start="3"><li>&lt;script&gt;window.__pwned = 2&lt;/script&gt;<ul><li><em>&lt;b&gt;x&lt;/b&gt;</em></li>'
        "</ul></li></ol>"),
    "```<i>lang</i> x\n<b>b</b>\n```": (
        f'<div class="code-block">{CODE_BAR.format("&lt;i&gt;lang&lt;/i&gt;")}<pre><code>&lt;b&gt;b&lt;/b&gt;'
        "</code></pre></div>"),
}


def show_replies(page, tmp_path: Path, replies: list[str]) -> None:
    """Imports one conversation holding these replies (as the Import button does)."""
    messages = [m for reply in replies
                for m in ({"role": "user", "content": "?"}, {"role": "assistant", "content": reply})]
    path = tmp_path / "convo.json"
    path.write_text(json.dumps([{"title": "markdown", "messages": messages}]))
    page.set_input_files("#import", str(path))
    page.locator(".message.assistant").nth(len(replies) - 1).wait_for()


def test_common_model_output_renders_as_commonmark_would_and_escaped(page, tmp_path: Path) -> None:
    show_replies(page, tmp_path, list(RENDERED))
    bodies = page.locator(".message.assistant .body")
    assert {text: bodies.nth(i).inner_html() for i, text in enumerate(RENDERED)} == RENDERED
    assert page.evaluate("window.__pwned") is None


CODE = "print('hi')\nprint('there')"


@pytest.mark.parametrize("clipboard", ["absent", "refusing"])
def test_copy_says_so_when_nothing_was_copied_and_selects_the_code(page, tmp_path: Path, clipboard: str) -> None:
    """It said "Copied" either way: on http://LAN-IP:PORT (not a secure context) there is no
    navigator.clipboard, and a refused writeText was taken for done."""
    show_replies(page, tmp_path, [f"```python\n{CODE}\n```"])
    if clipboard == "absent":
        page.evaluate("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
    else:
        page.evaluate("() => { navigator.clipboard.writeText = () => Promise.reject(new DOMException('no', "
                      "'NotAllowedError')); }")
    page.click(".code-block .copy")
    page.locator(".code-block .copy", has_text="Copy failed").wait_for(timeout=1000)
    assert page.evaluate("window.getSelection().toString()") == CODE  # (Ctrl+C copies it)


def test_copy_copies_the_code(page, tmp_path: Path) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    show_replies(page, tmp_path, [f"```python\n{CODE}\n```"])
    page.click(".code-block .copy")
    page.locator(".code-block .copy", has_text="Copied").wait_for(timeout=1000)
    assert page.evaluate("navigator.clipboard.readText()") == CODE
