// Waits until a page has done what it does after its load event: MathJax's typesetting (which asks for
// its fonts only then, at times well after the last script arrived), and the fonts that the page's layout uses.
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  void document.body.offsetHeight;  // lay the page out, so that the fonts it uses start loading
  await document.fonts.ready;
}
