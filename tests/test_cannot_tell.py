"""The checks' fourth answer: kept apart from "not testable" on the page, and never read as true or false."""

import pandas as pd
import pytest

from deepnorm_exp.analysis import claims
from deepnorm_exp.analysis.cannot_tell import CANNOT_TELL, every

from test_results import evidence


def test_cannot_tell_has_no_truth_value():
    with pytest.raises(TypeError, match="compare with `is CANNOT_TELL`"):
        bool(CANNOT_TELL)
    with pytest.raises(TypeError):
        all([True, CANNOT_TELL])  # `all(orders)` read an overlap as not met before


@pytest.mark.parametrize("answers, expected", [
    ([True, True], True),
    ([True, False, CANNOT_TELL], False),  # one reverse shown decides
    ([True, CANNOT_TELL, None], CANNOT_TELL),  # an overlap is evidence both ways; a saturated comparison is none
    ([True, None], None),
    ([], None),  # nothing compared is nothing shown (all([]) would say True)
])
def test_every_comparison_must_hold(answers, expected):
    assert every(answers) is expected


@pytest.mark.parametrize("met, outcome", [(True, claims.REPRODUCED), (False, claims.NOT_REPRODUCED),
                                          (None, claims.NOT_TESTABLE), (CANNOT_TELL, claims.UNDECIDED)])
def test_each_answer_has_its_own_verdict_on_the_page(met, outcome):
    claim = claims.Claim("a claim", "some_study", "a rule", lambda e: (met, "numbers"))
    assert claim.judge(evidence(runs_some_study=pd.DataFrame({"run_name": ["r"]}))) == (
        claims.Verdict(outcome, "numbers"))
