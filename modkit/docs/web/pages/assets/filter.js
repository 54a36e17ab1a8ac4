// Filter box above a generated table: <input class="mk-filter" data-target="ID"> hides rows of the table inside
// element ID that do not contain every word typed. Works with and without material's instant navigation.
(function () {
  function wire() {
    document.querySelectorAll("input.mk-filter").forEach(function (input) {
      if (input.dataset.wired) return;
      input.dataset.wired = "1";
      var box = document.getElementById(input.dataset.target);
      if (!box) return;
      input.addEventListener("input", function () {
        var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
        box.querySelectorAll("tbody tr").forEach(function (row) {
          var text = row.textContent.toLowerCase();
          row.style.display = words.every(function (w) { return text.indexOf(w) >= 0; }) ? "" : "none";
        });
      });
    });
  }
  if (typeof document$ !== "undefined") { document$.subscribe(wire); }
  else { document.addEventListener("DOMContentLoaded", wire); }
})();
