"""SISResult's text: scores shown with enough digits never to round onto 0, 1 or the threshold."""
import torch

from overinterp_fast.methods.results import SISResult, score_text


def test_score_text_keeps_the_order_against_zero_one_and_tau():
    assert score_text(0.95) == "0.95"
    assert score_text(0.999998) == "0.999998"  # "1" at four digits
    assert score_text(0.99996) == "0.99996"
    assert score_text(1.0) == "1" and score_text(0.0) == "0"
    assert score_text(3e-9) == "3e-09"
    assert score_text(0.89996, 0.9) == "0.89996"  # "0.9" would read as passing tau 0.9
    assert score_text(0.90004, 0.9) == "0.90004"
    assert score_text(0.89996) == "0.9"  # no threshold to keep apart from
    assert score_text(0.999998, fixed=True) == "0.999998"
    assert score_text(0.93, 0.9, digits=2, fixed=True) == "0.93"
    assert score_text(0.8996, 0.9, digits=2, fixed=True) == "0.8996"


def test_repr_and_notebook_view_of_a_score_just_under_one():
    order = torch.tensor([1, 0])
    r = SISResult(order=order, values=torch.tensor([0.9, 0.1], dtype=torch.float64), sis=torch.tensor([0]),
                  mask=torch.tensor([True, False]), target=2, score=0.999998, threshold=0.9, sis_score=0.89999999)
    assert repr(r) == "SISResult(target=2, score=0.999998, threshold=0.9, features=2, sis_size=1)"
    page = r._repr_html_()
    assert "<td>0.999998</td>" in page and "<td>1</td>" not in page
    assert "<td>0.89999999</td>" in page
