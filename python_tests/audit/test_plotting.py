"""plotting.py's panels and figure checked by hand: the scaling, the overlay and SIS-alone colours on colour and
grey images, a flat image, and what the figure draws (panel titles, row labels, colour maps, display range,
size in pixels).

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import matplotlib.image
import numpy as np
import pytest
from overinterp_fast.audit import plotting


@pytest.mark.mutation
def test_panels_of_a_grey_image_by_hand():
    img = np.array([[2.0, 4.0], [6.0, 10.0]])
    mask = np.array([[False, True], [True, False]])
    norm, overlay, alone = plotting.sis_panels(img, mask)
    assert norm.tolist() == [[0.0, 0.25], [0.5, 1.0]]  # (x - 2) / (10 - 2)
    assert overlay.shape == alone.shape == (2, 2, 3)
    assert overlay[0, 0].tolist() == [0.0, 0.0, 0.0] and overlay[1, 1].tolist() == pytest.approx([0.6] * 3)
    assert overlay[0, 1].tolist() == [1.0, 0.1, 0.1] and overlay[1, 0].tolist() == [1.0, 0.1, 0.1]
    # SIS alone: its pixels in their own grey level on every channel, the rest mid-grey
    assert alone[0, 1].tolist() == [0.25] * 3 and alone[1, 0].tolist() == [0.5] * 3
    assert alone[0, 0].tolist() == [0.5] * 3 and alone[1, 1].tolist() == [0.5] * 3
    norm2, _, alone2 = plotting.sis_panels(img, np.array([[1, 0], [0, 1]]))  # 0/1 ints: a mask, not row indices
    assert alone2[1, 1].tolist() == [1.0] * 3 and alone2[0, 0].tolist() == [0.0] * 3
    assert alone2[0, 1].tolist() == [0.5] * 3 and alone2[1, 0].tolist() == [0.5] * 3


@pytest.mark.mutation
def test_panels_of_a_colour_image_by_hand():
    img = np.zeros((1, 2, 3))
    img[0, 0] = [0, 30, 60]
    img[0, 1] = [90, 120, 150]
    norm, overlay, alone = plotting.sis_panels(img, np.array([[False, True]]))
    assert norm[0, 0].tolist() == [0.0, 0.2, 0.4] and norm[0, 1].tolist() == pytest.approx([0.6, 0.8, 1.0])
    assert overlay[0, 0].tolist() == pytest.approx([0.6 * 0.2] * 3)  # darkened grey: 0.6 x the channel mean
    assert overlay[0, 1].tolist() == [1.0, 0.1, 0.1]
    assert alone[0, 1].tolist() == pytest.approx([0.6, 0.8, 1.0]) and alone[0, 0].tolist() == [0.5] * 3


@pytest.mark.mutation
def test_flat_image_and_no_sis():
    norm, overlay, alone = plotting.sis_panels(np.full((2, 3), 7.0), None)
    assert norm.tolist() == [[0.0] * 3] * 2 and overlay.shape == (2, 3, 3) and (overlay == 0).all()
    assert (alone == 0.5).all() and alone.shape == (2, 3, 3)
    norm, overlay, alone = plotting.sis_panels(np.full((2, 2, 3), 200, dtype=np.uint8), np.ones((2, 2), bool))
    assert (norm == 0).all() and (alone == 0).all() and (overlay == [1.0, 0.1, 0.1]).all()
    assert norm.dtype == np.float64 and alone.dtype == np.float64  # floats in [0, 1], whatever the input type
    # uint8 input is scaled as floats (no wrap-around below the minimum)
    norm, _, _ = plotting.sis_panels(np.array([[250, 10]], dtype=np.uint8), None)
    assert norm.tolist() == [[1.0, 0.0]]


@pytest.mark.mutation
def test_show_panel_draws_in_the_unit_range_without_ticks():
    plt = plotting.pyplot()
    assert plt.get_backend().lower() == "agg"
    fig, (a, b) = plt.subplots(1, 2)
    plotting.show_panel(a, np.zeros((2, 2)), "grey", cmap="magma", fontsize=7)
    plotting.show_panel(b, np.full((2, 2, 3), 0.25) + np.eye(2)[..., None] / 2)  # values 0.25..0.75
    ia, ib = a.get_images()[0], b.get_images()[0]
    assert ia.get_cmap().name == "magma" and ia.get_clim() == (0, 1) and ib.get_clim() == (0, 1)
    assert ia.get_interpolation() == "nearest" and ib.get_interpolation() == "nearest"
    assert list(a.get_xticks()) == [] and list(a.get_yticks()) == [] and list(b.get_xticks()) == []
    assert list(b.get_yticks()) == []
    assert a.get_title() == "grey" and a.title.get_fontsize() == 7 and b.get_title() == ""
    plotting.show_panel(b, np.array([[0.2, 0.4], [0.6, 0.8]]), "t")
    assert b.get_images()[1].get_cmap().name == "gray" and b.title.get_fontsize() == 9
    assert b.get_images()[1].get_clim() == (0, 1)  # the unit range, not the panel's own 0.2..0.8
    plt.close(fig)


@pytest.mark.mutation
def test_figure_rows_titles_and_size(monkeypatch, tmp_path):
    plt = plotting.pyplot()
    figures = []
    real_close = plt.close

    class Recording:
        def __getattr__(self, name):
            return getattr(plt, name)

        @staticmethod
        def close(fig):
            figures.append(fig)
            real_close(fig)

    monkeypatch.setattr(plotting, "pyplot", lambda: Recording())
    img = np.arange(16, dtype=float).reshape(4, 4)
    path = tmp_path / "f.png"
    plotting.sis_figure([img, np.stack([img] * 3, -1)], [img > 10, None], ["first", "second"], str(path),
                        cmap="viridis", dpi=50)
    (fig,) = figures
    axes = np.array(fig.axes).reshape(2, 3)
    assert [ax.get_title() for ax in axes[0]] == ["image", "SIS (red)", "SIS alone"]
    assert [ax.get_title() for ax in axes[1]] == ["", "", ""]
    assert axes[0, 0].get_ylabel() == "first" and axes[1, 0].get_ylabel() == "second"
    assert axes[0, 1].get_ylabel() == "" and axes[0, 0].yaxis.label.get_fontsize() == 8
    assert axes[0, 0].yaxis.label.get_rotation() == 0 and axes[0, 0].yaxis.label.get_ha() == "right"
    assert axes[0, 0].yaxis.label.get_va() == "center"
    assert axes[0, 0].get_images()[0].get_cmap().name == "viridis"
    # the panels drawn are sis_panels' own
    norm, overlay, alone = plotting.sis_panels(img, img > 10)
    for ax, panel in zip(axes[0], (norm, overlay, alone)):
        assert np.array_equal(ax.get_images()[0].get_array(), panel)
    assert tuple(fig.get_size_inches()) == pytest.approx((6.6, 4.4))
    assert matplotlib.image.imread(str(path)).shape[:2] == (220, 330)  # 4.4 x 6.6 inches at 50 dpi
    plotting.sis_figure([img], [None], ["one"], str(path))
    assert matplotlib.image.imread(str(path)).shape[:2] == (264, 792)  # 2.2 x 6.6 inches at 120 dpi (default)
    assert figures[1].axes[0].get_images()[0].get_cmap().name == "gray"


def _sis_result(mask, sis, score=0.8, sis_score=0.75):
    import torch
    from overinterp_fast.methods.results import SISResult

    return SISResult(order=torch.arange(mask.numel()), values=torch.zeros(mask.numel(), dtype=torch.float64),
                     sis=sis, mask=None if sis is None else mask, target=7, score=score, threshold=0.5,
                     sis_score=sis_score)


def test_plot_sis_draws_the_image_and_the_sis_alone_on_the_baseline():
    import torch

    plt = plotting.pyplot()
    mask = torch.tensor([[False, True], [False, False]])
    res = _sis_result(mask, torch.tensor([1]))
    image = torch.tensor([[[0.0, 1.0], [2.0, 4.0]]] * 3)  # [C, H, W], as a model input: channels first
    axes = plotting.plot_sis(res, image)
    assert len(axes) == 2 and axes[0].figure is axes[1].figure
    shown = axes[0].images[0].get_array()
    assert np.asarray(shown).tolist() == [[[0.0] * 3, [0.25] * 3], [[0.5] * 3, [1.0] * 3]]  # (x - 0) / (4 - 0)
    alone = np.asarray(axes[1].images[0].get_array())
    assert alone[0, 1].tolist() == [0.25] * 3 and alone[0, 0].tolist() == [0.5] * 3  # the rest mid-grey
    assert axes[0].get_title() == "class 7: f(x) 0.80" and axes[1].get_title() == "SIS: 1 px (25.0%), f(SIS) 0.75"
    plt.close("all")
    # a baseline in the image's units (scaled as the image: 3 -> 0.75, 8 -> 1 at most), one Axes given: the SIS
    # panel only
    fig, ax = plt.subplots()
    baseline = np.full((2, 2, 3), 3.0)
    baseline[1, 0] = 8.0
    (drawn,) = plotting.plot_sis(res, image.permute(1, 2, 0).numpy(), ax, baseline=baseline)
    alone = np.asarray(drawn.images[0].get_array())
    assert drawn is ax and alone[1, 1].tolist() == [0.75] * 3 and alone[0, 1].tolist() == [0.25] * 3
    _, _, panel = plotting.sis_panels(image.permute(1, 2, 0).numpy(), mask.numpy(), baseline)
    assert panel[1, 0].tolist() == [1.0] * 3 and panel[1, 1].tolist() == [0.75] * 3  # clipped to [0, 1]
    none = _sis_result(mask, None, score=0.3, sis_score=None)
    (drawn,) = plotting.plot_sis(none, np.zeros((2, 2)), [ax])
    assert drawn.get_title() == "no SIS: f(x) 0.30 < tau 0.50"
    plt.close("all")


def test_plot_sis_refuses_what_it_cannot_draw():
    import torch

    res = _sis_result(torch.zeros(2, 2, dtype=torch.bool), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"^plot_sis needs a pixel mask on the image's grid \[3, 3\]; this "
                                         r"result's mask is \[2, 2\]$"):
        plotting.plot_sis(res, np.zeros((3, 3)))
    with pytest.raises(ValueError, match=r"^image must be \[H, W\], \[H, W, 3\] or \[C, H, W\] with C = 1 or 3, "
                                         r"got \[2, 2, 5\]$"):
        plotting.plot_sis(res, np.zeros((2, 2, 5)))
    with pytest.raises(ValueError, match=r"^the baseline has shape \[3, 3\]; the image \[2, 2\]$"):
        plotting.plot_sis(res, np.zeros((2, 2)), baseline=np.zeros((3, 3)))
    with pytest.raises(TypeError, match=r"^plot_sis draws one SISResult, got list$"):
        plotting.plot_sis([res], np.zeros((2, 2)))
    plt = plotting.pyplot()
    _, axes = plt.subplots(1, 3)
    with pytest.raises(ValueError, match=r"^ax: one Axes \(the SIS\) or two \(image, SIS\), got 3$"):
        plotting.plot_sis(res, np.zeros((2, 2)), axes)
    plt.close("all")
