// KaTeX (vendored in docs/javascripts/katex/, so formulas render offline) for pymdownx.arithmatex's generic
// output: \( ... \) inline, \[ ... \] display. Material's instant navigation swaps pages without a reload, so
// each new page is rendered on arrival.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true }
    ],
    throwOnError: false
  });
});
