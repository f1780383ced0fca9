// A small markdown renderer that only ever creates DOM nodes with textContent: model output
// can never become HTML or script. Supports fenced code blocks (with a copy button), inline
// code, **bold**, *italic*, headings, bullet and numbered lists (nested by indentation), and paragraphs.
"use strict";

const Markdown = (() => {
  // `code`, **strong**, *emphasis*: a `*` opens only before a non-space and closes only after one
  // (CommonMark's flanking rule), so `2 * 3 * 4` stays text and `**a * b**` stays one strong
  const INLINE = /(`[^`\n]+`)|\*\*(?![\s*])([^\n]*?[^\s*])\*\*|\*(?![\s*])([^\n]*?[^\s*])\*/g;
  // ```lang, with anything after the language (```python title="x.py"); ~~~ as well
  const FENCE = /^( {0,3})(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
  const HEADING = /^(#{1,4})\s+(.*)$/;
  const ITEM = /^([ \t]*)([-*+]|\d{1,9}[.)])\s+(.*)$/;

  function inline(parent, text) {
    let last = 0;
    for (const match of text.matchAll(INLINE)) {
      if (match.index > last) parent.appendChild(document.createTextNode(text.slice(last, match.index)));
      const [token, code, strong, em] = match;
      let node;
      if (code) {
        node = document.createElement("code");
        node.textContent = token.slice(1, -1);
      } else {
        node = document.createElement(strong ? "strong" : "em");
        inline(node, strong || em);
      }
      parent.appendChild(node);
      last = match.index + token.length;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function copyButton(codeEl) {
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.addEventListener("click", () => {
      writeClipboard(codeEl.textContent).then(() => flash(copy, "Copied"), () => {
        selectContents(codeEl);  // (Ctrl+C copies it then)
        flash(copy, "Copy failed");
      });
    });
    return copy;
  }

  // navigator.clipboard is only there in a secure context (https, localhost): not on http://LAN-IP:PORT
  function writeClipboard(text) {
    return navigator.clipboard ? navigator.clipboard.writeText(text) : Promise.reject(new Error("no clipboard here"));
  }

  function selectContents(el) {
    const range = document.createRange();
    range.selectNodeContents(el);
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
  }

  function flash(button, text) {
    button.textContent = text;
    setTimeout(() => { button.textContent = "Copy"; }, 1200);
  }

  function codeBlock(lang, code) {
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    const bar = document.createElement("div");
    bar.className = "code-bar";
    const label = document.createElement("span");
    label.textContent = lang || "code";
    const pre = document.createElement("pre");
    const codeEl = document.createElement("code");
    codeEl.textContent = code;
    pre.appendChild(codeEl);
    bar.append(label, copyButton(codeEl));
    wrap.append(bar, pre);
    return wrap;
  }

  // Each block reader takes the lines and an index, and gives {node, next} or null when the line starts no such block.

  function fenced(lines, i) {
    const open = lines[i].match(FENCE);
    if (!open) return null;
    const [, indent, fence, lang] = open;
    const body = [];
    let j = i + 1;
    while (j < lines.length && !closesFence(lines[j], fence)) body.push(outdented(lines[j++], indent.length));
    // j + 1: past the closing fence (or the end of a reply still streaming)
    return { node: codeBlock(lang, body.join("\n")), next: j + 1 };
  }

  // a closing fence: the opening's character, at least as many, nothing else
  function closesFence(line, fence) {
    const mark = line.trim();
    return mark.length >= fence.length && mark === fence[0].repeat(mark.length);
  }

  function outdented(line, nSpaces) {
    return line.slice(Math.min(nSpaces, line.length - line.trimStart().length));
  }

  function heading(lines, i) {
    const m = lines[i].match(HEADING);
    if (!m) return null;
    const h = document.createElement("h" + Math.min(6, m[1].length + 2));
    inline(h, m[2]);
    return { node: h, next: i + 1 };
  }

  function list(lines, i) {
    const first = lines[i].match(ITEM);
    if (!first) return null;
    const indent = first[1].length;
    const ordered = isOrdered(first[2]);
    const node = document.createElement(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);  // "3. third" is item 3
    let next = i;
    for (;;) {
      const at = nonBlankFrom(lines, next);  // items apart by blank lines are still one list
      const item = lines[at]?.match(ITEM);
      if (!item || item[1].length < indent) break;
      if (item[1].length > indent) {  // indented deeper: a list inside the last item
        const inner = list(lines, at);
        node.lastChild.appendChild(inner.node);
        next = inner.next;
        continue;
      }
      if (isOrdered(item[2]) !== ordered) break;
      const li = document.createElement("li");
      inline(li, item[3]);
      node.appendChild(li);
      next = at + 1;
    }
    return { node, next };
  }

  function isOrdered(marker) { return /\d/.test(marker); }

  function nonBlankFrom(lines, i) {
    while (i < lines.length && lines[i].trim() === "") i += 1;
    return i;
  }

  function paragraph(lines) {
    const p = document.createElement("p");
    lines.forEach((line, n) => {
      if (n) p.appendChild(document.createElement("br"));
      inline(p, line);
    });
    return p;
  }

  function render(text) {
    const root = document.createDocumentFragment();
    const lines = text.split("\n");
    let prose = [];
    const endParagraph = () => {
      if (prose.length) root.appendChild(paragraph(prose));
      prose = [];
    };
    let i = 0;
    while (i < lines.length) {
      const block = fenced(lines, i) || heading(lines, i) || list(lines, i);
      if (block) {
        endParagraph();
        root.appendChild(block.node);
        i = block.next;
        continue;
      }
      if (lines[i].trim() === "") endParagraph(); else prose.push(lines[i]);
      i += 1;
    }
    endParagraph();
    return root;
  }

  return { render };
})();
