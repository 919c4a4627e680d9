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
  const figures = [...article.querySelectorAll(".cell_output img")].filter(shown).map((img) => ({
    src: img.getAttribute("src"), alt: img.getAttribute("alt") || "",
    scale: img.getBoundingClientRect().width / img.naturalWidth,
  }));
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
    return {figures, sticking, scrollWidth: document.documentElement.scrollWidth, viewport};
  }
  const rawTex = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {acceptNode: (node) =>
    node.parentElement.closest("pre, code, script, style, textarea, mjx-container")
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
  const tex = /\\[()[\]]|\$\$|\$[A-Za-z\\{]|\\(frac|mathrm|sqrt|begin|cdot|sum|top|mathbb|lVert)\b|\{(cite|ref|doc|term|eq)(:[a-z]+)?\}`/;
  while (walker.nextNode()) {
    const text = walker.currentNode.textContent;
    if (tex.test(text)) rawTex.push(text.trim().slice(0, 80));
  }
  for (const math of document.querySelectorAll(".math")) {
    if (!math.querySelector("mjx-container")) rawTex.push(math.textContent.trim().slice(0, 80));
  }
  return {
    figures, rawTex,
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
