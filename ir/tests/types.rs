//! Element types, dims and tensor types.

use glmc_ir::{shape, DType, Dim, TensorType};

#[test]
fn dtype_names_round_trip() {
    for d in DType::ALL {
        assert_eq!(DType::from_name(d.name()), Some(d));
        assert_eq!(d.to_string(), d.name());
    }
    assert_eq!(DType::from_name("float32"), None);
    assert_eq!(DType::F8E4M3.name(), "f8e4m3");
    let sizes: Vec<u64> = DType::ALL.iter().map(|d| d.size_bytes()).collect();
    assert_eq!(sizes, [4, 2, 2, 1, 4, 8]);
    let floats: Vec<bool> = DType::ALL.iter().map(|d| d.is_float()).collect();
    assert_eq!(floats, [true, true, true, true, false, false]);
}

#[test]
fn shapes_and_display() {
    let t = TensorType::new(DType::BF16, shape!["b", "t", 2, 8]);
    assert_eq!(t.to_string(), "bf16[b,t,2,8]");
    assert_eq!(t.rank(), 4);
    assert_eq!(t.shape[0], Dim::sym("b"));
    assert_eq!(t.shape[2].as_const(), Some(2));
    assert_eq!(t.shape[1].as_const(), None);
    assert_eq!(t.with_dtype(DType::F32).to_string(), "f32[b,t,2,8]");
    assert_eq!(t.with_shape(shape![3]).to_string(), "bf16[3]");
    assert_eq!(TensorType::new(DType::F32, vec![]).to_string(), "f32[]");
}

#[test]
fn const_numel() {
    assert_eq!(
        TensorType::new(DType::F32, shape![2, 3, 4]).const_numel(),
        Some(24)
    );
    assert_eq!(TensorType::new(DType::F32, shape![]).const_numel(), Some(1));
    assert_eq!(
        TensorType::new(DType::F32, shape!["s", 4]).const_numel(),
        None
    );
    // An element count past u64 is unknown, not a panic or a wrapped number.
    let big = 1u64 << 32;
    assert_eq!(
        TensorType::new(DType::F32, shape![big, big]).const_numel(),
        None
    );
}
