// Where a chapter defines the functions and classes an exercise asks for: one entry per <pre> that defines one.
(names) => names.flatMap((name) => [...document.querySelectorAll("pre")]
  .filter((pre) => [`def ${name}(`, `class ${name}(`, `class ${name}:`].some((d) => pre.textContent.includes(d)))
  .map((pre) => ({
    name,
    shown: pre.offsetWidth > 0 && pre.checkVisibility({visibilityProperty: true, opacityProperty: true}),
    folded: !!pre.closest(".admonition.dropdown, details, .toggle-hidden, .tag_hide-input"),
    afterExerciseLink: [...document.querySelectorAll('a[href*="exercises/"]')]
      .some((a) => a.compareDocumentPosition(pre) & Node.DOCUMENT_POSITION_FOLLOWING),
  })))
