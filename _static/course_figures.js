// Draws the figures a reader can move (attention_course/interactive.py) with the BokehJS that this page loads
// (_ext/course_figures.py adds both to the pages that hold such a figure, and to no other). Each figure is a
// <div class="course-figure"> holding Bokeh's JSON description of it; once it is drawn, its cell's output is
// marked `course-figure-live`, which hides the still image on screen (_static/course_figures.css). Where
// BokehJS is missing or fails, nothing is marked and the still image stays.
(() => {
  const draw = () => {
    if (typeof Bokeh === "undefined") return;
    for (const figure of document.querySelectorAll(".course-figure")) {
      const item = JSON.parse(figure.querySelector("script.course-figure-item").textContent);
      const root = figure.querySelector(".course-figure-root");
      Bokeh.embed.embed_item(item, root.id).then(() => {
        figure.classList.add("course-figure-live");
        (figure.closest(".cell_output") || figure).classList.add("course-figure-live");
      });
    }
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
