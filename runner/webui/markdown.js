// A small markdown renderer that only ever creates DOM nodes with textContent: model output
// can never become HTML or script. Supports fenced code blocks (with a copy button), inline
// code, **bold**, *italic*, headings, bullet and numbered lists, and paragraphs.
"use strict";

const Markdown = (() => {
  function inline(parent, text) {
    // `code`, **bold**, *italic*, in one left-to-right scan
    const pattern = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*)/g;
    let last = 0;
    let match;
    while ((match = pattern.exec(text)) !== null) {
      if (match.index > last) parent.appendChild(document.createTextNode(text.slice(last, match.index)));
      const token = match[0];
      let node;
      if (token.startsWith("`")) {
        node = document.createElement("code");
        node.textContent = token.slice(1, -1);
      } else if (token.startsWith("**")) {
        node = document.createElement("strong");
        node.textContent = token.slice(2, -2);
      } else {
        node = document.createElement("em");
        node.textContent = token.slice(1, -1);
      }
      parent.appendChild(node);
      last = match.index + token.length;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function codeBlock(lang, code) {
    const wrap = document.createElement("div");
    wrap.className = "code-block";
    const bar = document.createElement("div");
    bar.className = "code-bar";
    const label = document.createElement("span");
    label.textContent = lang || "code";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.addEventListener("click", () => {
      const done = () => { copy.textContent = "Copied"; setTimeout(() => { copy.textContent = "Copy"; }, 1200); };
      if (navigator.clipboard) navigator.clipboard.writeText(code).then(done, done); else done();
    });
    bar.append(label, copy);
    const pre = document.createElement("pre");
    const codeEl = document.createElement("code");
    codeEl.textContent = code;
    pre.appendChild(codeEl);
    wrap.append(bar, pre);
    return wrap;
  }

  function render(text) {
    const root = document.createDocumentFragment();
    const lines = text.split("\n");
    let i = 0;
    let paragraph = [];
    const flush = () => {
      if (paragraph.length) {
        const p = document.createElement("p");
        paragraph.forEach((line, n) => {
          if (n) p.appendChild(document.createElement("br"));
          inline(p, line);
        });
        root.appendChild(p);
        paragraph = [];
      }
    };
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^```\s*([\w+-]*)\s*$/);
      if (fence) {
        flush();
        const body = [];
        i += 1;
        while (i < lines.length && !/^```\s*$/.test(lines[i])) body.push(lines[i++]);
        i += 1; // the closing fence (or the end of a reply still streaming)
        root.appendChild(codeBlock(fence[1], body.join("\n")));
        continue;
      }
      const heading = line.match(/^(#{1,4})\s+(.*)$/);
      if (heading) {
        flush();
        const h = document.createElement("h" + Math.min(6, heading[1].length + 2));
        inline(h, heading[2]);
        root.appendChild(h);
        i += 1;
        continue;
      }
      const item = line.match(/^\s*([-*]|\d+\.)\s+(.*)$/);
      if (item) {
        flush();
        const list = document.createElement(/\d/.test(item[1]) ? "ol" : "ul");
        while (i < lines.length) {
          const m = lines[i].match(/^\s*([-*]|\d+\.)\s+(.*)$/);
          if (!m) break;
          const li = document.createElement("li");
          inline(li, m[2]);
          list.appendChild(li);
          i += 1;
        }
        root.appendChild(list);
        continue;
      }
      if (line.trim() === "") flush(); else paragraph.push(line);
      i += 1;
    }
    flush();
    return root;
  }

  return { render };
})();
