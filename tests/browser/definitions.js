// Where a chapter defines the functions an exercise asks for: one entry per <pre> that defines one.
(names) => names.flatMap((name) => [...document.querySelectorAll("pre")]
  .filter((pre) => pre.textContent.includes(`def ${name}(`))
  .map((pre) => ({
    name,
    shown: pre.offsetWidth > 0 && pre.checkVisibility({visibilityProperty: true, opacityProperty: true}),
    folded: !!pre.closest(".admonition.dropdown, details, .toggle-hidden, .tag_hide-input"),
    afterExerciseLink: [...document.querySelectorAll('a[href*="exercises/"]')]
      .some((a) => a.compareDocumentPosition(pre) & Node.DOCUMENT_POSITION_FOLLOWING),
  })))
