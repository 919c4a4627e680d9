"""Figures a reader can move: a Bokeh layout for the book's pages, with a still image of it for print.

A chapter computes everything such a figure shows in Python, with the course's functions, and asserts it.
The controls (sliders, toggles) then only *select*: each position of the controls has one **frame**, the
values that the figure's models (data sources, titles, ranges) take there, computed in the cell. The
callback in the browser looks the position's frame up and assigns it; it computes nothing. A cell:

    plot = figure(title="...")                   # a Bokeh figure with the course's defaults
    ...                                          # glyphs on ColumnDataSources
    link([slider], {"weights": source}, frames)  # frames["1"] = {"weights": {"data": {...}}}
    show(stack(slider, plot), name="softmax-temperature")

``show``, the cell's last line, outputs two things: the figure as HTML (a ``<div class="course-figure">``
holding Bokeh's JSON description of it, no script and no address), which the book draws with the BokehJS
it serves itself (``_ext/course_figures.py``), then a matplotlib still of the figure in its default state,
drawn from the same models by :func:`still`. The still is what a printed page, a reader without
JavaScript and a notebook outside the book (Jupyter, Colab: nothing there draws the HTML) show; on the
book's pages it is hidden once the live figure is drawn. The cell's ``alt`` metadata gives its alt text.

Only core Bokeh models and widgets are served: no tables, WebGL or LaTeX (MathText) labels.
"""

from __future__ import annotations

import html
import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from bokeh.core.property.vectorization import Field, Value
from bokeh.embed import json_item
from bokeh.layouts import column
from bokeh.models import (
    AbstractSlider,
    Arrow,
    CategoricalSlider,
    Checkbox,
    CheckboxButtonGroup,
    CheckboxGroup,
    CustomJS,
    FixedTicker,
    GlyphRenderer,
    Grid,
    LayoutDOM,
    Legend,
    Line,
    LinearColorMapper,
    LogScale,
    Model,
    Plot,
    Quad,
    RadioButtonGroup,
    RadioGroup,
    Range1d,
    Rect,
    Scatter,
    Select,
    Slider,
    Span,
    Switch,
    Toggle,
    VBar,
    Widget,
)
from bokeh.plotting import figure as bokeh_figure

# the book's text column is about 740 px wide on a desktop; a still image is drawn at this width (inches,
# 100 dpi), as the chapters' own figures are, and its panels at the Bokeh heights (px / 100)
STILL_WIDTH = 5.6

# In the browser: the index of the controls' position (each control's position is looked up in the list of
# its positions), then, for each target, the values that the table gives it there. Nothing is computed:
# a data column's values are one row of a stacked array, sliced out.
SELECT_FRAME = """
const index = controls.reduce((at, control, i) => {
  const value = control[properties[i]];
  const key = Array.isArray(value)
    ? [...value].sort((a, b) => a - b).join(",") : String(value);
  return at * keys[i].length + keys[i].indexOf(key);
}, 0);
names.forEach((name, t) => {
  const row = table[index * names.length + t];
  const changes = {};
  for (const [property, choices] of Object.entries(values[name])) {
    changes[property] = choices[row];
  }
  targets[name].setv(changes);
  const data = {};
  for (const [column, stacked] of Object.entries(columns[name])) {
    const length = stacked.length / counts[name];
    data[column] = Array.from(
      {length}, (_, k) => stacked[row * length + k]);
  }
  if (Object.keys(data).length) {
    targets[name].data = {...targets[name].data, ...data};
  }
});
"""


def figure(**options: Any) -> Plot:
    """A Bokeh figure with the course's defaults: the column's width, no toolbar, no tools.

    Args:
        **options: any of ``bokeh.plotting.figure``'s options; they override the defaults
            (``sizing_mode="stretch_width"``, ``height=260``, ``tools=""``, ``toolbar_location=None``).

    Returns:
        The figure. It stretches to the width of the page's column (390 px phones to 1280 px desktops)
        and keeps its height.
    """
    defaults = {
        "sizing_mode": "stretch_width",
        "height": 260,
        "tools": "",
        "toolbar_location": None,
    }
    plot = bokeh_figure(**{**defaults, **options})
    plot.title.text_font_size = "13px"
    return plot


def stack(*children: LayoutDOM) -> LayoutDOM:
    """Controls and figures one under another, each as wide as the page's column.

    Args:
        *children: Bokeh widgets and figures, top to bottom.

    Returns:
        A Bokeh ``column``; every child without a sizing mode of its own stretches to its width.
    """
    for child in children:
        if child.sizing_mode is None:
            child.sizing_mode = "stretch_width"
    return column(*children, sizing_mode="stretch_width")


def positions(control: Widget) -> list[Any]:
    """Every position a control can take, as ``link`` keys frames by.

    Args:
        control: a ``Slider`` (integer start, end and step), ``CategoricalSlider``, ``Select``,
            ``Toggle``, ``Checkbox`` or ``Switch``, ``CheckboxButtonGroup`` or ``CheckboxGroup`` (every
            subset of its labels, as a sorted tuple of indices), ``RadioButtonGroup`` or ``RadioGroup``.

    Returns:
        The positions: ints, strings, bools or tuples of ints.

    Raises:
        TypeError: for another control, or a ``Slider`` whose start, end or step is not an integer
            (its positions would be floats, whose text differs between Python and JavaScript).
    """
    if isinstance(control, Slider):
        ends = (control.start, control.end, control.step)
        if not all(float(x).is_integer() for x in ends):
            raise TypeError(
                f"slider {control.title!r}: start, end and step must be "
                f"integers, got {ends}; index a list of values instead"
            )
        start, end, step = (int(x) for x in ends)
        return list(range(start, end + 1, step))
    if isinstance(control, CategoricalSlider):
        return list(control.categories)
    if isinstance(control, Select):
        return [o if isinstance(o, str) else o[0] for o in control.options]
    if isinstance(control, Toggle | Checkbox | Switch):
        return [False, True]
    if isinstance(control, CheckboxButtonGroup | CheckboxGroup):
        indices = range(len(control.labels))
        return [
            subset
            for size in range(len(indices) + 1)
            for subset in itertools.combinations(indices, size)
        ]
    if isinstance(control, RadioButtonGroup | RadioGroup):
        return list(range(len(control.labels)))
    raise TypeError(
        f"link does not know the positions of a {type(control)}"
    )


def link(
    controls: Sequence[Widget],
    targets: Mapping[str, Model],
    frames: Mapping[tuple, Mapping[str, Mapping[str, Any]]],
) -> None:
    """Make the controls select among frames computed in Python, and show the frame of their position now.

    Args:
        controls: the widgets, in the order of the parts of the frames' keys.
        targets: the models that the frames change, by name: ``ColumnDataSource``s, titles, ranges,
            spans, ``Div``s.
        frames: one frame for every position of the controls: ``frames[(p_1, ..., p_n)]``, ``p_i`` a
            position of ``controls[i]`` (see :func:`positions`; with one control, ``frames[p_1]``), maps
            each target's name to the values of its properties there: ``{"text": "T = 1"}`` for a title,
            ``{"end": 8.5}`` for a range, ``{"data": {"top": weights}}`` for a data source, whose other
            columns are kept. A target gets the same properties in every frame, and a data column the
            same length. Values are numbers, strings, lists, numpy arrays or tensors; tensors and arrays
            travel as float32, int32 or uint8 (bool) arrays.

    Raises:
        ValueError: if a position of the controls has no frame, a frame belongs to no position, or
            frames give a target different properties or a column different lengths.
        TypeError: for a control whose positions are unknown (see :func:`positions`).

    Identical values are sent once: frames that share a target's values refer to one copy.
    """
    keys = [list(map(_key_part, positions(c))) for c in controls]
    given = {_key(key): key for key in frames}
    everywhere = ["|".join(key) for key in itertools.product(*keys)]
    if len(given) != len(frames) or set(given) != set(everywhere):
        missing = sorted(set(everywhere) - set(given))
        extra = sorted(set(given) - set(everywhere))
        raise ValueError(
            "frames must cover every position of the controls once: "
            f"missing {missing[:5]}, unexpected {extra[:5]}"
        )
    names = sorted(targets)
    # per target: its distinct values (a frame refers to one of them by its
    # row), and each frame's row
    distinct: dict[str, dict] = {name: {} for name in names}
    table = []
    for key in everywhere:
        frame = frames[given[key]]
        if set(frame) != set(names):
            raise ValueError(
                f"frame {given[key]} gives {sorted(frame)}; every frame must "
                f"give each of the targets {names}"
            )
        for name in names:
            value = _transportable(frame[name])
            rows = distinct[name]
            table.append(
                rows.setdefault(_fingerprint(value), (len(rows), value))[0]
            )
    values, columns, counts = {}, {}, {}
    for name in names:
        rows = [value for _, value in distinct[name].values()]
        counts[name] = len(rows)
        if any(set(row) != set(rows[0]) for row in rows):
            raise ValueError(f"frames give {name!r} different properties")
        data = [row.get("data", {}) for row in rows]
        values[name] = {
            p: [row[p] for row in rows] for p in rows[0] if p != "data"
        }
        columns[name] = {
            column: _stack([d[column] for d in data], name, column)
            for column in data[0]
        }
    callback = CustomJS(
        args={
            "controls": list(controls),
            "properties": [_property(c) for c in controls],
            "keys": keys,
            "names": names,
            "targets": dict(targets),
            "table": np.asarray(table, dtype=np.int32),
            "values": values,
            "columns": columns,
            "counts": counts,
        },
        code=SELECT_FRAME,
    )
    for control in controls:
        control.js_on_change(_property(control), callback)
    now = _key(tuple(getattr(c, _property(c)) for c in controls))
    if now not in given:
        raise ValueError(f"the controls' position {now} has no frame")
    for name, properties in frames[given[now]].items():
        _assign(targets[name], _transportable(properties))


def html_for(layout: LayoutDOM, name: str) -> str:
    """The HTML of a live figure: a ``<div class="course-figure">`` with Bokeh's JSON description of it.

    The book's extension (``_ext/course_figures.py``) loads BokehJS on pages that hold such a div and
    draws the figure into it; the HTML itself holds no script to run and no address.

    Args:
        layout: the Bokeh layout (a figure, or a ``column`` of controls and figures).
        name: the figure's name, unique on its page: lower-case letters, digits and hyphens. It names
            the div (``data-course-figure``, ``id="course-figure-<name>"``) and the layout's root model.

    Returns:
        The HTML.

    Raises:
        ValueError: if ``name`` is not lower-case letters, digits and hyphens.
    """
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name):
        raise ValueError(
            f"name must be lower-case letters, digits and hyphens, got "
            f"{name!r}"
        )
    layout.name = name
    target = f"course-figure-{name}"
    # "</" cannot end the script element early: JSON allows \u003c for "<"
    item = json.dumps(json_item(layout, target), separators=(",", ":"))
    item = item.replace("<", "\\u003c")
    return (
        f'<div class="course-figure" data-course-figure="{html.escape(name)}">'
        f'<div class="course-figure-root" id="{target}"></div>'
        f'<script type="application/json" class="course-figure-item">{item}'
        "</script></div>"
    )


@dataclass(frozen=True)
class LiveFigure:
    """A figure's HTML (:func:`html_for`), which a notebook shows as HTML when it is a cell's value."""

    name: str
    html: str = field(repr=False)

    def _repr_html_(self) -> str:
        return self.html


def show(layout: LayoutDOM, name: str) -> LiveFigure:
    """The live figure, for the last line of a notebook cell, and its still image, drawn with pyplot.

    The notebook shows the returned figure as the cell's value (its HTML, :func:`html_for`), then, when
    the cell ends, the still image (:func:`still`), as it shows every figure that pyplot draws in a cell:
    in its figure format (the chapters' "retina": twice the pixels). The cell's ``alt`` metadata gives the
    still image its alt text, one text for the one image.

    Args:
        layout: the Bokeh layout, its controls in their default position.
        name: the figure's name, unique on its page (see :func:`html_for`).

    Returns:
        The live figure.

    Raises:
        ValueError: as :func:`html_for` and :func:`still` do.
    """
    live = LiveFigure(name, html_for(layout, name))
    still(layout)  # left open for the notebook to show after the HTML
    return live


def still(layout: LayoutDOM) -> plt.Figure:
    """Draw the figures of a Bokeh layout with matplotlib, as they are now: one panel per figure.

    A figure of a fixed size (``sizing_mode="fixed"``) keeps its width, and one that matches its
    aspect (``match_aspect=True``) keeps its axes' units equal. The glyphs drawn are those the course's
    figures use: ``VBar``, ``Quad``, ``Rect``, ``Line`` and ``Scatter``, colours from a
    ``LinearColorMapper``, ``Span`` and ``Arrow`` annotations, legends, titles, axis labels, fixed
    ranges (``Range1d``, reversed too), fixed ticks and their labels, log scales. Widgets are left out.

    Args:
        layout: a figure, or a layout (``column``, ``row``) that holds figures; each figure is drawn at
            :data:`STILL_WIDTH` inches wide and its Bokeh height (pixels / 100) high, one under another.

    Returns:
        A new matplotlib figure.

    Raises:
        ValueError: if the layout holds no figure, or a figure holds a glyph or an annotation that is
            not drawn here.
    """
    plots = list(_plots(layout))
    if not plots:
        raise ValueError("the layout holds no figure to draw")
    heights = [(p.height or 260) / 100 for p in plots]
    # figures of a fixed size keep it; the others take the column's width
    fixed = all(p.sizing_mode in (None, "fixed") and p.width for p in plots)
    width = max(p.width for p in plots) / 100 if fixed else STILL_WIDTH
    image, axes = plt.subplots(
        len(plots),
        1,
        figsize=(width, sum(heights)),
        height_ratios=heights,
        layout="constrained",
        squeeze=False,
    )
    for plot, ax in zip(plots, axes[:, 0], strict=True):
        _draw_plot(plot, ax)
    return image


# --- keys and values of the frames


def _property(control: Widget) -> str:
    """The property that holds a control's position."""
    if isinstance(control, AbstractSlider | Select):
        return "value"
    return "active"


def _key_part(position: Any) -> str:
    """A position as JavaScript's ``String()`` writes the control's value (see SELECT_FRAME)."""
    if isinstance(position, bool):
        return "true" if position else "false"
    if isinstance(position, int | str):
        return str(position)
    if isinstance(position, tuple | list):
        return ",".join(str(int(i)) for i in sorted(position))
    raise TypeError(
        f"a position is an int, str, bool or tuple, got {position!r}"
    )


def _key(key: Any) -> str:
    """A frame's key as the browser writes the controls' position: its parts joined by "|"."""
    parts = key if isinstance(key, tuple) else (key,)
    return "|".join(
        _key_part(tuple(p) if isinstance(p, list) else p) for p in parts
    )


def _stack(arrays: list, name: str, column: str) -> np.ndarray:
    """The values of one data column in every distinct frame, one after another."""
    arrays = [np.asarray(a) for a in arrays]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise ValueError(
            f"{name}.data[{column!r}] must have one length in every frame"
        )
    return _transportable(np.concatenate(arrays))


def _transportable(value: Any) -> Any:
    """Tensors and float64 arrays as compact numpy arrays (float32, int32 or uint8), recursively."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype == np.bool_:
            return value.astype(np.uint8)
        if np.issubdtype(value.dtype, np.floating):
            return value.astype(np.float32)
        if np.issubdtype(value.dtype, np.integer):
            return value.astype(np.int32)
        return value
    if isinstance(value, Mapping):
        return {k: _transportable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_transportable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _fingerprint(value: Any) -> Any:
    """A hashable stand-in for a frame's values, equal for equal values."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, Mapping):
        return tuple(sorted((k, _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_fingerprint(v) for v in value)
    return value


def _assign(target: Model, properties: Mapping[str, Any]) -> None:
    """Give a model a frame's values, in Python: the layout's default state."""
    for name, value in properties.items():
        if name == "data":
            target.data = {**target.data, **value}
        else:
            setattr(target, name, value)


# --- the still image


def _plots(layout: LayoutDOM) -> Iterator[Plot]:
    if isinstance(layout, Plot):
        yield layout
        return
    for child in getattr(layout, "children", []):
        # a grid's child is (model, row, column)
        yield from _plots(child[0] if isinstance(child, tuple) else child)


MARKERS = {"circle": "o", "square": "s", "triangle": "^", "diamond": "D"}


def _linestyle(dash: Any) -> Any:
    """A Bokeh dash pattern (a name, or lengths in pixels) as a matplotlib line style."""
    named = {"solid": "-", "dashed": "--", "dotted": ":", "dotdash": "-."}
    if isinstance(dash, str):
        return named.get(dash, "-")
    if not dash:
        return "-"
    lengths = list(dash) * (2 if len(dash) % 2 else 1)  # on, off, ...
    # Bokeh's pixels (at 100 dpi) as matplotlib's points
    return (0, tuple(0.72 * length for length in lengths))


def _draw_plot(plot: Plot, ax: plt.Axes) -> None:
    labels = {
        id(renderer): item.label.value
        for legend in plot.legend
        for item in legend.items
        if isinstance(item.label, Value)
        for renderer in item.renderers
    }
    for renderer in plot.renderers:
        if not isinstance(renderer, GlyphRenderer):
            raise ValueError(f"cannot draw a {type(renderer).__name__}")
        if renderer.visible:
            _draw_glyph(renderer, ax, labels.get(id(renderer)))
    for annotation in plot.center:
        if isinstance(annotation, Span | Arrow):
            if annotation.visible:
                _draw_annotation(annotation, ax)
        elif not isinstance(annotation, Legend | Grid):
            raise ValueError(f"cannot draw a {type(annotation).__name__}")
    if plot.title is not None and plot.title.text:
        ax.set_title(plot.title.text, fontsize=10, wrap=True)
    for axes, rng, scale, which in (
        (plot.xaxis, plot.x_range, plot.x_scale, "x"),
        (plot.yaxis, plot.y_range, plot.y_scale, "y"),
    ):
        if axes and axes[0].axis_label:
            getattr(ax, f"set_{which}label")(axes[0].axis_label)
        if axes and isinstance(axes[0].ticker, FixedTicker):
            ticks, overrides = (
                axes[0].ticker.ticks,
                axes[0].major_label_overrides,
            )
            getattr(ax, f"set_{which}ticks")(
                ticks, [str(overrides.get(t, f"{t:g}")) for t in ticks]
            )
        if isinstance(scale, LogScale):
            getattr(ax, f"set_{which}scale")("log")
        if isinstance(rng, Range1d):  # reversed where start > end
            getattr(ax, f"set_{which}lim")(rng.start, rng.end)
    if plot.match_aspect:
        ax.set_aspect("equal")
    if labels:
        ax.legend(fontsize=9)


def _values(spec: Any, data: Mapping, length: int) -> Any:
    """A property's values: a column of the data (through its colour mapper), or one value."""
    if isinstance(spec, str) and spec in data:
        spec = Field(spec)
    if isinstance(spec, Value):
        return spec.value
    if not isinstance(spec, Field):
        return (
            "none" if spec is None else spec
        )  # no colour: matplotlib's none
    column = np.asarray(data[spec.field])
    if isinstance(spec.transform, LinearColorMapper):
        mapper = spec.transform
        palette = list(mapper.palette)
        where = (column - mapper.low) / (mapper.high - mapper.low)
        return [
            palette[int(np.clip(w * len(palette), 0, len(palette) - 1))]
            for w in where
        ]
    if isinstance(spec.transform, Model):  # another transform
        raise ValueError(f"cannot draw a {type(spec.transform).__name__}")
    return np.broadcast_to(column, (length,))


def _draw_glyph(
    renderer: GlyphRenderer, ax: plt.Axes, label: str | None
) -> None:
    glyph, data = renderer.glyph, renderer.data_source.data
    length = len(next(iter(data.values()), []))

    def get(name: str) -> Any:
        value = _values(getattr(glyph, name), data, length)
        if name in ("x", "y", "top", "bottom", "left", "right", "width"):
            return np.broadcast_to(
                np.asarray(value, dtype=float), (length,)
            )
        return value

    if isinstance(glyph, VBar | Quad | Rect):
        if isinstance(glyph, VBar):
            left, width = get("x") - get("width") / 2, get("width")
            bottom, height = get("bottom"), get("top") - get("bottom")
        elif isinstance(glyph, Quad):
            left, width = get("left"), get("right") - get("left")
            bottom, height = get("bottom"), get("top") - get("bottom")
        else:
            height = np.broadcast_to(get("height"), (length,))
            left, width = get("x") - get("width") / 2, get("width")
            bottom = get("y") - height / 2
        ax.bar(
            left,
            height,
            width,
            bottom,
            align="edge",
            color=get("fill_color"),
            alpha=get("fill_alpha"),
            edgecolor=get("line_color"),
            linewidth=get("line_width"),
            label=label,
        )
    elif isinstance(glyph, Line):
        ax.plot(
            get("x"),
            get("y"),
            color=get("line_color"),
            linewidth=get("line_width"),
            linestyle=_linestyle(glyph.line_dash),
            alpha=get("line_alpha"),
            label=label,
        )
    elif isinstance(glyph, Scatter):
        ax.scatter(
            get("x"),
            get("y"),
            # Bokeh's size is a diameter in pixels, matplotlib's an area in
            # points squared (72 points in an inch of 100 pixels)
            s=(np.asarray(get("size"), dtype=float) * 0.72) ** 2,
            marker=MARKERS.get(get("marker"), "o"),
            c=get("fill_color"),
            edgecolors=get("line_color"),
            alpha=get("fill_alpha"),
            label=label,
            zorder=3,
        )
    else:
        raise ValueError(f"cannot draw a {type(glyph).__name__} glyph")


def _draw_annotation(annotation: Span | Arrow, ax: plt.Axes) -> None:
    style = {
        "color": annotation.line_color,
        "linewidth": annotation.line_width,
        "alpha": annotation.line_alpha,
    }
    if isinstance(annotation, Span):
        draw = ax.axhline if annotation.dimension == "width" else ax.axvline
        draw(
            annotation.location,
            linestyle=_linestyle(annotation.line_dash),
            **style,
        )
        return
    data = annotation.source.data
    length = len(next(iter(data.values()), []))
    ends = [
        np.broadcast_to(
            _values(getattr(annotation, end), data, length), length
        )
        for end in ("x_start", "y_start", "x_end", "y_end")
    ]
    for x0, y0, x1, y1 in zip(*ends, strict=True):
        ax.annotate(
            "",
            xy=(x1, y1),
            xytext=(x0, y0),
            arrowprops={"arrowstyle": "-|>", "mutation_scale": 15, **style},
        )
