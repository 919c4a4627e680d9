// Measures a page of the book as the reader's browser shows it (tests/test_browser.py).
// Called with phone = false at desktop width, then with phone = true at phone width.
async (phone) => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const images = [...document.images];
  images.forEach((img) => { if (img.loading === "lazy") img.loading = "eager"; });
  await Promise.all(images.map((img) => img.complete ? null : new Promise((done) => {
    img.addEventListener("load", done); img.addEventListener("error", done);
  })));
  const shown = (el) => el.offsetWidth > 0 && el.checkVisibility({visibilityProperty: true, opacityProperty: true});
  const article = document.querySelector("article.bd-article") || document.body;
  const viewport = document.documentElement.clientWidth;
  // a figure's scale: its width on screen over the width it was drawn for (in CSS pixels: the width that
  // the notebook's output gives it, else one image pixel per CSS pixel); density: image pixels per CSS pixel
  const figures = [...article.querySelectorAll(".cell_output img")].filter(shown).map((img) => {
    const width = img.getBoundingClientRect().width;
    return {
      src: img.getAttribute("src"), alt: img.getAttribute("alt") || "",
      scale: width / (parseFloat(img.style.width) || img.naturalWidth),
      density: img.naturalWidth / width,
    };
  });
  // display equations wider than the column, which cuts them off (MathJax 3 does not break lines): the TeX
  const tex = new Map(window.MathJax && MathJax.startup && MathJax.startup.document
    ? [...MathJax.startup.document.math].map((item) => [item.typesetRoot, item.math]) : []);
  const wideEquations = [...article.querySelectorAll('mjx-container[display="true"]')].filter(shown)
    .filter((box) => box.querySelector("mjx-math").getBoundingClientRect().width > box.clientWidth + 1)
    .map((box) => (tex.get(box) || box.textContent).replace(/\s+/g, " ").trim().slice(0, 80));
  // the characters of an element's text, each with the box the browser drew it in
  const characters = (element) => {
    const found = [], walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const node = walker.currentNode;
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i); range.setEnd(node, i + 1);
        found.push({char: node.data[i], box: range.getBoundingClientRect()});
      }
    }
    return found;
  };
  // where a run of characters (in reading order) starts a new line: the indices of the first on each new line
  const breaks = (chars) => {
    const found = [], drawn = chars.filter((c) => c.box.height > 0);
    for (let i = 1; i < drawn.length; i++) {
      if (drawn[i].box.top > drawn[i - 1].box.top + drawn[i - 1].box.height / 2) found.push(chars.indexOf(drawn[i]));
    }
    return found;
  };
  // inline code broken between two letters, digits or underscores of a word (an identifier, a path) that
  // would have fitted on a line of its own, with room for a punctuation mark after it; in a table that line
  // is the column's (a cell may grow, and the table scroll), elsewhere its paragraph's. A break after a
  // hyphen or a slash is the browser's usual line break, not a split word.
  const splitWords = [];
  for (const code of article.querySelectorAll("code")) {
    if (code.closest("pre") || !shown(code)) continue;
    const block = code.closest("td, th") ? code.closest("table").parentElement
      : code.closest("p, li, dd, dt, h1, h2, h3, h4, h5, h6, figcaption, div");
    const style = getComputedStyle(block);
    const line = block.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const words = [[]];
    for (const c of characters(code)) {
      if (/\s/.test(c.char)) words.push([]); else words[words.length - 1].push(c);
    }
    for (const word of words) {
      const split = breaks(word).some((i) => /\w/.test(word[i - 1].char) && /\w/.test(word[i].char));
      const width = word.reduce((sum, c) => sum + c.box.width, 0);
      if (split && width + width / word.length <= line) {
        splitWords.push(word.map((c) => c.char).join(""));
      }
    }
  }
  // lines of code (cells and included sources, not their outputs) that wrap onto a second line
  const wrappedCode = [];
  for (const pre of article.querySelectorAll("div.highlight pre")) {
    if (pre.closest(".cell_output") || !shown(pre)) continue;
    const lines = [[]];
    for (const c of characters(pre)) {
      if (c.char === "\n") lines.push([]); else lines[lines.length - 1].push(c);
    }
    for (const line of lines.filter((l) => breaks(l).length)) wrappedCode.push(line.map((c) => c.char).join(""));
  }
  if (phone) {
    // what sticks out past the right edge, outside any box that scrolls on its own
    const sticking = [];
    for (const el of article.querySelectorAll("*")) {
      const box = el.getBoundingClientRect();
      if (box.width === 0 || box.right <= viewport + 1) continue;
      if (el.closest("mjx-assistive-mml")) continue;  // MathJax's copy for screen readers, clipped away
      let parent = el.parentElement, contained = false;
      while (parent && parent !== document.body) {
        const overflow = getComputedStyle(parent).overflowX;
        if ((overflow === "auto" || overflow === "scroll") && parent.getBoundingClientRect().right <= viewport + 1) {
          contained = true; break;
        }
        parent = parent.parentElement;
      }
      if (!contained) sticking.push(`<${el.tagName.toLowerCase()} class="${el.className}"> ${el.textContent.trim().slice(0, 60)}`);
    }
    return {figures, wideEquations, splitWords, wrappedCode, sticking, scrollWidth: document.documentElement.scrollWidth, viewport};
  }
  // text outside code and maths that looks like TeX or MyST (or Markdown emphasis that was not recognised)
  const rawTex = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {acceptNode: (node) =>
    node.parentElement.closest("pre, code, script, style, textarea, mjx-container")
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  const source = /\\[()[\]]|\$\$|\$[A-Za-z\\{]|\\(frac|mathrm|sqrt|begin|cdot|sum|top|mathbb|lVert)\b|\{(cite|ref|doc|term|eq)(:[a-z]+)?\}`|\*\*[^\s*]|[^\s*]\*\*/;
  while (walker.nextNode()) {
    const text = walker.currentNode.textContent;
    if (source.test(text)) rawTex.push(text.trim().slice(0, 80));
  }
  for (const math of document.querySelectorAll(".math")) {
    if (!math.querySelector("mjx-container")) rawTex.push(math.textContent.trim().slice(0, 80));
  }
  return {
    figures, wideEquations, splitWords, wrappedCode, rawTex,
    images: images.map((img) => ({src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0})),
    links: [...document.querySelectorAll("a[href]")].map((a) => a.href),
    ids: [...document.querySelectorAll("[id]")].map((el) => el.id)
      .concat([...document.querySelectorAll("a[name]")].map((a) => a.name)),
    cutCode: [...document.querySelectorAll("pre")].filter(shown)
      .filter((pre) => pre.scrollWidth > pre.clientWidth + 1)
      .map((pre) => pre.textContent.split("\n").reduce((a, b) => (b.length > a.length ? b : a), "")),
    text: document.body.innerText,
  };
}
