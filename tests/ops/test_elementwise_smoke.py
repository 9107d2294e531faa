from tests.helpers import check_op, rand


def test_relu_add():
    check_op("Relu", [rand(3, 4)])
    check_op("Add", [rand(3, 4), rand(4)])
    check_op("Add", [rand(3, 4), rand(4)], opset=13)
    check_op("Equal", [rand(3, 4, dtype="int64", low=0, high=3), rand(4, dtype="int64", low=0, high=3)])
