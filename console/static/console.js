// The Sluice console's only script: confirmation before destructive buttons, "select all" boxes.
// Pages work without it (the server checks every confirmation that matters).
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-confirm]");
  if (button && !window.confirm(button.dataset.confirm)) event.preventDefault();
});
document.addEventListener("change", (event) => {
  const all = event.target.closest("[data-check-all]");
  if (!all) return;
  const form = all.closest("form");
  for (const box of form.querySelectorAll(`input[type=checkbox][name="${all.dataset.checkAll}"]`)) box.checked = all.checked;
});
