"""attention_course.interactive: frames selected by controls, the figure's HTML, and its still image.

The browser tests (tests/test_browser_figures.py) move the book's figures; these check, without a browser,
that every position of the controls selects its own frame's values (by reading the arrays that the
callback reads, in the order it reads them), and what the module refuses.
"""

from __future__ import annotations

import itertools
import json
import re

import matplotlib
import numpy as np
import pytest
from bokeh.models import CategoricalSlider, CheckboxButtonGroup, ColumnDataSource, Slider, Span, Toggle

from attention_course import interactive

matplotlib.use("agg")


def callback_args(control) -> dict:
    (callback,) = next(iter(control.js_property_callbacks.values()))
    return callback.args


def selected(args: dict, position: tuple) -> dict:
    """What the browser's callback (interactive.SELECT_FRAME) assigns at ``position``, step by step."""
    index = 0
    for keys, part in zip(args["keys"], position, strict=True):
        index = index * len(keys) + keys.index(interactive._key((part,)))
    assigned = {}
    for t, name in enumerate(args["names"]):
        row = int(args["table"][index * len(args["names"]) + t])
        values = {prop: choices[row] for prop, choices in args["values"][name].items()}
        for column, stacked in args["columns"][name].items():
            length = len(stacked) // args["counts"][name]
            values.setdefault("data", {})[column] = list(stacked[row * length : (row + 1) * length])
        assigned[name] = values
    return assigned


def three_controls():
    slider = Slider(start=0, end=2, step=1, value=1, title="n")
    toggle = Toggle(label="scaled", active=False)
    group = CheckboxButtonGroup(labels=["a", "b"], active=[1])
    return [slider, toggle, group]


def frames_for(controls) -> dict:
    frames = {}
    for n, scaled, subset in itertools.product(*map(interactive.positions, controls)):
        value = n * (10 if scaled else 1) + 100 * len(subset)
        frames[n, scaled, subset] = {
            "bars": {"data": {"top": np.full(3, value, dtype=np.float64)}},
            "line": {"location": float(value)},
            "title": {"text": f"{n} {scaled} {subset}"},
        }
    return frames


def test_every_position_selects_its_own_frame():
    controls = three_controls()
    source, line = ColumnDataSource({"x": [0, 1, 2]}), Span(dimension="width")
    plot = interactive.figure()
    plot.vbar(x="x", top="top", width=0.5, source=source)
    frames = frames_for(controls)
    interactive.link(controls, {"bars": source, "line": line, "title": plot.title}, frames)
    args = callback_args(controls[0])
    assert len(frames) == 3 * 2 * 4
    for position, frame in frames.items():
        got = selected(args, position)
        assert got["bars"]["data"]["top"] == list(frame["bars"]["data"]["top"])
        assert got["line"]["location"] == frame["line"]["location"]
        assert got["title"]["text"] == frame["title"]["text"]
    # identical values are sent once: 3 slider positions x 2 x 3 subset sizes at most
    assert args["counts"]["bars"] == len({f["line"]["location"] for f in frames.values()})
    # the models start in the frame of the controls' position: n = 1, not scaled, {b}
    assert list(source.data["top"]) == [101.0] * 3 and line.location == 101.0
    assert plot.title.text == "1 False (1,)"


def test_frames_must_cover_every_position_once():
    controls = three_controls()
    frames = frames_for(controls)
    targets = {
        "bars": ColumnDataSource({"x": [0, 1, 2]}),
        "line": Span(),
        "title": interactive.figure().title,
    }
    missing = dict(frames)
    del missing[2, True, (0, 1)]
    with pytest.raises(ValueError, match=r"missing \['2\|true\|0,1'\]"):
        interactive.link(controls, targets, missing)
    extra = {**frames, (3, True, ()): frames[2, True, ()]}
    with pytest.raises(ValueError, match=r"unexpected \['3\|true\|'\]"):
        interactive.link(controls, targets, extra)
    with pytest.raises(ValueError, match="every frame must give each of the targets"):
        interactive.link(controls, {**targets, "more": Span()}, frames)


def test_positions_of_each_kind_of_control():
    assert interactive.positions(Slider(start=2, end=8, step=3, value=2)) == [2, 5, 8]
    assert interactive.positions(CategoricalSlider(categories=["1", "10"], value="1")) == ["1", "10"]
    assert interactive.positions(Toggle()) == [False, True]
    assert interactive.positions(CheckboxButtonGroup(labels=["a", "b"])) == [(), (0,), (1,), (0, 1)]
    with pytest.raises(TypeError, match="must be integers"):
        interactive.positions(Slider(start=0, end=1, step=0.1, value=0))


def test_the_html_holds_data_only():
    slider = Slider(start=0, end=1, step=1, value=0)
    plot = interactive.figure()
    source = ColumnDataSource({"x": [0.0], "y": [0.0]})
    plot.scatter("x", "y", source=source)
    frames = {p: {"title": {"text": f"</script><script>alert({p})</script>"}} for p in (0, 1)}
    interactive.link([slider], {"title": plot.title}, frames)
    html = interactive.html_for(interactive.stack(slider, plot), "a-figure")
    assert html.startswith('<div class="course-figure" data-course-figure="a-figure">')
    # one script element, JSON, which a title cannot end early
    assert html.count("<script") == 1 and html.count("</script>") == 1
    assert 'type="application/json"' in html and "://" not in html
    item = json.loads(re.search(r'class="course-figure-item">(.*)</script>', html).group(1))
    assert item["target_id"] == "course-figure-a-figure" and item["root_id"]
    with pytest.raises(ValueError, match="lower-case"):
        interactive.html_for(plot, "A figure")


def test_the_still_image_draws_the_default_state():
    slider = Slider(start=0, end=1, step=1, value=1)
    bars = ColumnDataSource({"x": [0, 1]})
    plot = interactive.figure(y_range=(0, 3), x_axis_label="key")
    plot.vbar(x="x", top="top", width=0.5, source=bars)
    frames = {
        p: {"bars": {"data": {"top": [p + 1, 2 * p + 1]}}, "title": {"text": f"p = {p}"}} for p in (0, 1)
    }
    interactive.link([slider], {"bars": bars, "title": plot.title}, frames)
    image = interactive.still(interactive.stack(slider, plot, interactive.figure()))
    try:
        first, second = image.axes
        assert first.get_title() == "p = 1" and first.get_xlabel() == "key"
        assert first.get_ylim() == (0, 3)
        assert [patch.get_height() for patch in first.patches] == [2, 3]
        assert len(second.patches) == 0
    finally:
        matplotlib.pyplot.close(image)


def test_the_still_image_refuses_what_it_cannot_draw():
    plot = interactive.figure()
    plot.wedge(x=[0], y=[0], radius=1, start_angle=0, end_angle=1)
    with pytest.raises(ValueError, match="cannot draw a Wedge glyph"):
        interactive.still(plot)
