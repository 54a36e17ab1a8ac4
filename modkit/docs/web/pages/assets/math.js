// Typeset the math of a page with the bundled KaTeX. pymdownx.arithmatex (generic mode) turns $...$ into
// <span class="arithmatex">\(...\)</span> and $$...$$ into <div class="arithmatex">\[...\]</div>; only those
// elements are rendered, so a dollar sign elsewhere stays text. Runs on every page material's instant
// navigation shows, and on plain loads without it.
(function () {
  function typeset() {
    if (typeof renderMathInElement === "undefined") return;
    document.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, {
        delimiters: [
          { left: "\\(", right: "\\)", display: false },
          { left: "\\[", right: "\\]", display: true }
        ],
        throwOnError: false
      });
    });
  }
  if (typeof document$ !== "undefined") { document$.subscribe(typeset); }
  else { document.addEventListener("DOMContentLoaded", typeset); }
})();
