//! The layout operations of the host tensor that weight recipes are built from.

use glmc_ir::DType;
use glmc_runtime::{Data, Tensor, TensorError};
use proptest::prelude::*;

fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::f32(shape.to_vec(), (0..n).map(|i| i as f32).collect()).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.as_f32().unwrap().to_vec()
}

#[test]
fn constructors_and_accessors() {
    let t = Tensor::i64(vec![2, 2], vec![1, -2, 3, 4]).unwrap();
    assert_eq!(t.shape(), &[2, 2]);
    assert_eq!(t.numel(), 4);
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.as_i64().unwrap(), &[1, -2, 3, 4]);
    assert!(matches!(t.as_f32(), Err(TensorError::DType { .. })));
    assert_eq!(t.clone().into_i64().unwrap(), vec![1, -2, 3, 4]);
    assert!(t.into_f32().is_err());

    let z = Tensor::zeros(vec![2, 3]);
    assert_eq!(z.data(), &Data::F32(vec![0.0; 6]));
    assert_eq!(Tensor::zeros(vec![]).numel(), 1);
}

#[test]
fn constructor_rejects_wrong_length() {
    let err = Tensor::f32(vec![2, 3], vec![0.0; 5]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "new: shape [2, 3] holds 6 elements but 5 were given"
    );
}

#[test]
fn transpose_2x3() {
    let t = arange(&[2, 3]).transpose(&[1, 0]).unwrap();
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(values(&t), [0., 3., 1., 4., 2., 5.]);
}

#[test]
fn transpose_3d() {
    // src[i][j][k] = 6i + 3j + k with shape [2, 2, 3]; out[k][i][j] = src[i][j][k].
    let t = arange(&[2, 2, 3]).transpose(&[2, 0, 1]).unwrap();
    assert_eq!(t.shape(), &[3, 2, 2]);
    assert_eq!(
        values(&t),
        [0., 3., 6., 9., 1., 4., 7., 10., 2., 5., 8., 11.]
    );
}

#[test]
fn transpose_i64_and_identity() {
    let t = Tensor::i64(vec![2, 2], vec![1, 2, 3, 4]).unwrap();
    assert_eq!(
        t.transpose(&[1, 0]).unwrap().as_i64().unwrap(),
        &[1, 3, 2, 4]
    );
    assert_eq!(t.transpose(&[0, 1]).unwrap(), t);
}

#[test]
fn transpose_rejects_bad_permutations() {
    let t = arange(&[2, 3]);
    for perm in [vec![0], vec![0, 0], vec![0, 2], vec![0, 1, 2]] {
        let err = t.transpose(&perm).unwrap_err();
        assert_eq!(
            err,
            TensorError::Perm {
                perm,
                shape: vec![2, 3]
            }
        );
    }
}

#[test]
fn slice_each_axis() {
    let t = arange(&[2, 3]);
    let cols = t.slice(1, 1, 3).unwrap();
    assert_eq!(cols.shape(), &[2, 2]);
    assert_eq!(values(&cols), [1., 2., 4., 5.]);
    let rows = t.slice(0, 1, 2).unwrap();
    assert_eq!(rows.shape(), &[1, 3]);
    assert_eq!(values(&rows), [3., 4., 5.]);
    let empty = t.slice(1, 2, 2).unwrap();
    assert_eq!(empty.shape(), &[2, 0]);
    assert_eq!(empty.numel(), 0);
}

#[test]
fn slice_errors_name_the_shape() {
    let t = arange(&[2, 3]);
    assert_eq!(
        t.slice(1, 2, 4).unwrap_err().to_string(),
        "slice 2..4 of axis 1 is outside shape [2, 3]"
    );
    assert_eq!(
        t.slice(2, 0, 1).unwrap_err().to_string(),
        "slice: axis 2 out of range for shape [2, 3]"
    );
    assert!(t.slice(0, 2, 1).is_err());
}

#[test]
fn concat_both_axes() {
    let a = arange(&[2, 2]);
    let b = Tensor::f32(vec![2, 1], vec![10., 11.]).unwrap();
    let c = Tensor::concat(1, &[a.clone(), b]).unwrap();
    assert_eq!(c.shape(), &[2, 3]);
    assert_eq!(values(&c), [0., 1., 10., 2., 3., 11.]);

    let d = Tensor::f32(vec![1, 2], vec![7., 8.]).unwrap();
    let e = Tensor::concat(0, &[a, d]).unwrap();
    assert_eq!(e.shape(), &[3, 2]);
    assert_eq!(values(&e), [0., 1., 2., 3., 7., 8.]);
}

#[test]
fn concat_errors() {
    let a = arange(&[2, 2]);
    let err = Tensor::concat(1, &[a.clone(), arange(&[3, 1])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "concat: shapes [2, 2] and [3, 1] do not fit together"
    );
    assert_eq!(
        Tensor::concat(0, &[]).unwrap_err(),
        TensorError::Empty { op: "concat" }
    );
    let ints = Tensor::i64(vec![2, 2], vec![0; 4]).unwrap();
    assert!(matches!(
        Tensor::concat(0, &[a.clone(), ints]),
        Err(TensorError::DType { op: "concat", .. })
    ));
    assert!(matches!(
        Tensor::concat(2, &[a]),
        Err(TensorError::Axis { op: "concat", .. })
    ));
}

#[test]
fn stack_adds_leading_axis() {
    let a = Tensor::f32(vec![2], vec![1., 2.]).unwrap();
    let b = Tensor::f32(vec![2], vec![3., 4.]).unwrap();
    let s = Tensor::stack(&[a.clone(), b]).unwrap();
    assert_eq!(s.shape(), &[2, 2]);
    assert_eq!(values(&s), [1., 2., 3., 4.]);
    let err = Tensor::stack(&[a, arange(&[3])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stack: shapes [2] and [3] do not fit together"
    );
    assert_eq!(
        Tensor::stack(&[]).unwrap_err().to_string(),
        "stack of no tensors"
    );
}

#[test]
fn reshape_keeps_order() {
    let t = arange(&[2, 3]).reshape(vec![3, 2]).unwrap();
    assert_eq!(t.shape(), &[3, 2]);
    assert_eq!(values(&t), [0., 1., 2., 3., 4., 5.]);
    assert_eq!(
        t.reshape(vec![4]).unwrap_err().to_string(),
        "reshape of [3, 2] (6 elements) to [4] (4 elements)"
    );
}

/// A shape of rank 1..=4 with small dims (zero included, to cover empty tensors).
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 1..=4)
}

fn shape_and_perm() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    shape().prop_flat_map(|s| {
        let rank = s.len();
        (Just(s), Just((0..rank).collect::<Vec<_>>()).prop_shuffle())
    })
}

/// Row-major offset of `index` in `shape`.
fn offset(index: &[usize], shape: &[usize]) -> usize {
    index.iter().zip(shape).fold(0, |acc, (i, d)| acc * d + i)
}

/// The multi-index of row-major `offset` in `shape`.
fn unravel(mut offset: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        index[d] = offset % shape[d];
        offset /= shape[d];
    }
    index
}

/// A cut of `shape` along one axis into pieces: the axis and the cut points.
fn shape_and_cuts() -> impl Strategy<Value = (Vec<usize>, usize, Vec<usize>)> {
    shape().prop_flat_map(|s| {
        let rank = s.len();
        (Just(s), 0..rank).prop_flat_map(|(s, axis)| {
            let len = s[axis];
            (Just(s), Just(axis), prop::collection::vec(0..=len, 0..4))
        })
    })
}

proptest! {
    #[test]
    fn transpose_matches_index_definition((shape, perm) in shape_and_perm()) {
        let t = arange(&shape);
        let out = t.transpose(&perm).unwrap();
        let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        prop_assert_eq!(out.shape(), out_shape.as_slice());
        let src = values(&t);
        for (o, v) in values(&out).into_iter().enumerate() {
            let out_index = unravel(o, &out_shape);
            let mut src_index = vec![0; shape.len()];
            for (i, &p) in perm.iter().enumerate() {
                src_index[p] = out_index[i];
            }
            prop_assert_eq!(v, src[offset(&src_index, &shape)]);
        }
    }

    #[test]
    fn transpose_then_inverse_is_identity((shape, perm) in shape_and_perm()) {
        let t = arange(&shape);
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        let back = t.transpose(&perm).unwrap().transpose(&inverse).unwrap();
        prop_assert_eq!(back, t);
    }

    #[test]
    fn concat_of_slices_reassembles((shape, axis, mut cuts) in shape_and_cuts()) {
        let t = arange(&shape);
        cuts.push(0);
        cuts.push(shape[axis]);
        cuts.sort_unstable();
        let pieces: Vec<Tensor> = cuts
            .windows(2)
            .map(|w| t.slice(axis, w[0], w[1]).unwrap())
            .collect();
        prop_assert_eq!(Tensor::concat(axis, &pieces).unwrap(), t);
    }
}

/// What a GPU buffer holds round-trips through the host: bf16 rounds to nearest-even, strided
/// reads pick the elements at their offsets, and a short buffer is an error, not a panic.
#[test]
fn device_bytes_round_trip() {
    let t = Tensor::f32(vec![2, 2], vec![1.0, 1.0 + 1.0 / 256.0, -2.5, 3.0]).unwrap();
    let bf = t.to_bytes(DType::BF16).unwrap();
    assert_eq!(bf.len(), 8);
    let back = Tensor::from_device_bytes(vec![2, 2], DType::BF16, &bf, &[0, 2, 4, 6]).unwrap();
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7 in bf16: nearest-even gives 1.
    assert_eq!(back.as_f32().unwrap(), &[1.0, 1.0, -2.5, 3.0]);
    let col = Tensor::from_device_bytes(vec![2], DType::BF16, &bf, &[2, 6]).unwrap();
    assert_eq!(col.as_f32().unwrap(), &[1.0, 3.0]);
    let ids = Tensor::i64(vec![2], vec![-1, 7]).unwrap();
    let raw = ids.to_bytes(DType::I64).unwrap();
    let ids_back = Tensor::from_device_bytes(vec![2], DType::I64, &raw, &[0, 8]).unwrap();
    assert_eq!(ids_back.as_i64().unwrap(), &[-1, 7]);
    assert!(Tensor::from_device_bytes(vec![1], DType::F32, &raw[..2], &[0]).is_err());
    // Runs of consecutive elements: the rows of [2, 2] read backwards, and a run past the end.
    let rows = Tensor::from_device_runs(vec![2, 2], DType::BF16, &bf, &[4, 0], 2).unwrap();
    assert_eq!(rows.as_f32().unwrap(), &[-2.5, 3.0, 1.0, 1.0]);
    assert!(Tensor::from_device_runs(vec![2], DType::BF16, &bf, &[6], 2).is_err());
    assert!(t.to_bytes(DType::I64).is_err());
    assert!(t.to_bytes(DType::F8E4M3).is_err());
}

#[test]
fn rounded_to_rounds_floats_to_bf16_and_f16_and_keeps_the_rest() {
    let tiny = 2f32.powi(-100);
    let values = vec![1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), tiny, -2.5];
    let t = Tensor::f32(vec![4], values.clone()).unwrap();
    let bf16 = t.clone().rounded_to(DType::BF16);
    // Ties go to even; bf16 has f32's exponents, so 2^-100 stays.
    assert_eq!(
        bf16.as_f32().unwrap(),
        [1.0, 1.0 + 2f32.powi(-6), tiny, -2.5]
    );
    assert_eq!(bf16.clone().rounded_to(DType::BF16), bf16, "idempotent");
    // f16 holds the first two exactly; 2^-100 is far below its smallest subnormal (2^-24).
    let f16 = t.clone().rounded_to(DType::F16);
    assert_eq!(
        f16.as_f32().unwrap(),
        [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), 0.0, -2.5]
    );
    assert_eq!(t.clone().rounded_to(DType::F32), t);
    let ints = Tensor::i64(vec![2], vec![3, -7]).unwrap();
    assert_eq!(ints.clone().rounded_to(DType::BF16), ints);
}
