//! Shared by runtime tests: a recipe evaluated with plain tensor operations, the independent
//! reference for the loaders that build weights in place.

use glmc_ir::Recipe;
use glmc_runtime::Tensor;

/// `recipe` applied with tensor operations to whole tensors, each checkpoint tensor from
/// `leaf(name, shape)`.
pub fn by_tensor_ops(leaf: &dyn Fn(&str, &[u64]) -> Tensor, recipe: &Recipe) -> Tensor {
    let u = |d: &[u64]| d.iter().map(|&x| x as usize).collect::<Vec<_>>();
    match recipe {
        Recipe::Tensor { name, shape } => leaf(name, shape),
        Recipe::Stack {
            pattern,
            count,
            shape,
        } => Tensor::stack(
            &(0..*count)
                .map(|e| leaf(&Recipe::stack_member(pattern, e), shape))
                .collect::<Vec<_>>(),
        )
        .unwrap(),
        Recipe::Slice {
            src,
            axis,
            start,
            end,
        } => by_tensor_ops(leaf, src)
            .slice(*axis as usize, *start as usize, *end as usize)
            .unwrap(),
        Recipe::Concat { axis, parts } => Tensor::concat(
            *axis as usize,
            &parts
                .iter()
                .map(|p| by_tensor_ops(leaf, p))
                .collect::<Vec<_>>(),
        )
        .unwrap(),
        Recipe::Reshape { src, shape } => by_tensor_ops(leaf, src).reshape(u(shape)).unwrap(),
        Recipe::Transpose { src, perm } => by_tensor_ops(leaf, src).transpose(&u(perm)).unwrap(),
    }
}
